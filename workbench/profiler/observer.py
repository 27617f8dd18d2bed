"""The kernels a candidate launches as Nsight Compute sees them, from outside the candidate's process.

The evaluator's kernel table and provenance check come from a profiler running inside the candidate's process,
which the static and audit guards keep the candidate's hands off, but which it shares. For a new best the agent
runtime asks a second observer: ncu, which instruments the driver, lists every kernel one call launches, and the
same provenance rule (only the candidate's own Triton kernels, plus memory housekeeping) is applied to that list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from workbench import pyast
from workbench.profiler import kernels, ncu

DURATION_METRIC = "gpu__time_duration.sum"
"""One cheap metric: ncu then needs a single replay pass per kernel, and every launched kernel is listed."""


def jit_names(source: str) -> list[str]:
    """Names of the @triton.jit functions a candidate defines (what its kernels may be called)."""
    from workbench.evaluator.guards.static import jit_functions

    return jit_functions(pyast.parse(source))


def check(task: str, file: str | Path, shape: str, *, timeout_s: float = 180.0, gpu: str | None = None,
          runner: Callable[..., dict[str, Any]] = ncu.run) -> dict[str, Any]:
    """Run one call of `shape` under ncu on `gpu` (CUDA_VISIBLE_DEVICES; None: this process's) and judge the kernel
    list.

    Returns:
        {"observer": "ncu", "shape", "kernels": [name, ...], "problems": [line, ...]}; no problems means every
        kernel ncu saw is the candidate's own (or memory housekeeping).

    Raises:
        ncu.NcuError: ncu is missing, not permitted, or profiled nothing (the caller records it and moves on).
    """
    run = runner(task, file, shape, metrics=[DURATION_METRIC], timeout_s=timeout_s, gpu=gpu)
    names = [str(row["kernel"]) for row in run.get("rows", [])]
    if not names:
        raise ncu.NcuError(f"ncu listed no kernels for {shape}")
    calls = [[{"name": name, "kind": "kernel"} for name in names]]
    own = jit_names(Path(file).read_text())
    return {"observer": "ncu", "shape": shape, "kernels": names, "problems": kernels.provenance(calls, own)}
