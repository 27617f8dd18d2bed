"""A new best's kernels seen from outside its process (ncu on CUDA), by the slot that checked its held-out shapes.

The slot runs the observer right after that check, on the GPU its service uses and before it takes another job. So
ncu, which replays every kernel and takes seconds, never runs beside another slot's timed evaluation on a shared
GPU, and never in the head process, which runs on whichever GPU comes first and, under Ray, may have none.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.evaluator.result import EvalResult
    from workbench.tasks import Task

KernelObserver = Callable[["Task", Path, "str | None"], dict[str, Any]]
"""(task, candidate file, the GPU to run on as CUDA_VISIBLE_DEVICES takes it, or None) -> {"observer", "shape",
"kernels", "problems"}; raises when it cannot run."""


def heldout_passed(result: "EvalResult") -> bool:
    """Whether a held-out check passed: verdict ok and every held-out shape correct."""
    return result.get("verdict") == "ok" and all(s.get("correct") for s in result.get("heldout") or [])


def observe(observer: KernelObserver | None, task: "Task", path: Path, gpu: str | None,
            result: "EvalResult") -> None:
    """Add result["observed"] when `result` is a held-out check that passed; an observer that cannot run (ncu
    missing, counters not permitted) is noted there as {"error"}, and the best stands on the evaluator's own check."""
    if observer is None or not heldout_passed(result):
        return
    try:
        result["observed"] = observer(task, path, gpu)
    except Exception as exc:  # noqa: BLE001 - ncu missing or not permitted must not fail the check
        result["observed"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
