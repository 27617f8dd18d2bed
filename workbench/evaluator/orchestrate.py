"""evaluate(): one candidate, one evaluation service of its own (the CLI's form; a run keeps an EvaluationService).

This module never imports torch: the process that calls evaluate() stays light and is never exposed to candidate
code. The service and the candidate process start side by side, so a one-shot evaluation pays one start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from workbench.devices import DeviceError, resolve_device
from workbench.evaluator.errors import EvalUsageError
from workbench.evaluator.service import EvaluationService
from workbench.evaluator.submission import submit

if TYPE_CHECKING:
    from workbench.evaluator.result import EvalResult
    from workbench.tasks import Task


def evaluate(
    task: "Task",
    file: Path | str,
    *,
    device: str = "auto",
    heldout: bool = False,
    timeout_s: float | None = None,
    seeds: int = 3,
    static_guards: bool = True,
    graph: bool | None = None,
    secret_seeds: bool = True,
    on_stage: Callable[[dict[str, Any]], None] | None = None,
) -> "EvalResult":
    """Evaluate one candidate file against a task, in a service started (and stopped) for it.

    Args:
        task: the loaded task (its shapes, tolerance, forbidden lists, reference and baseline).
        file: the candidate: one Python file defining the task's entry function.
        device: "cuda", "cpu" (Triton interpreter, small shapes) or "auto" (cuda when a GPU looks present).
        heldout: also run the held-out shapes, reported under "heldout".
        timeout_s: a wall-clock limit for the whole evaluation (the limits derived from the task's timing apply
            either way).
        seeds: correctness seeds per shape (secret ones unless secret_seeds is False).
        static_guards: False skips the static source checks, so that the self-test can prove the run-time guards
            catch on their own what the static ones would have; every real evaluation keeps them.
        graph: also time both sides under CUDA graphs; None takes the task's graph_timing. Ignored on the CPU.
        secret_seeds: False uses seeds 0..seeds-1 (reproducible, for comparisons).
        on_stage: called with each step the service announces, for a progress display (EvaluationService.evaluate).

    Returns:
        The evaluator contract dict (EvalResult).

    Raises:
        EvalUsageError: a missing file, an unknown device, CUDA asked for but unavailable, or bad arguments.
        EvalServiceError: the trusted side failed twice (the service died, hung, or its baseline or oracle failed).
    """
    try:
        dev = resolve_device(device)
    except DeviceError as exc:
        raise EvalUsageError(str(exc)) from None
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise EvalUsageError(f"seeds must be a positive integer, got {seeds!r}")
    early = submit(task, file, dev, seeds, static_guards=static_guards).early
    if early is not None:
        return early  # type: ignore[return-value]  # no process needed to say it does not build or is forbidden
    with EvaluationService(task, dev, seeds=seeds, secret_seeds=secret_seeds, prestart=False,
                           prepare_heldout=False) as service:
        return service.evaluate(file, heldout=heldout, graph=graph, static_guards=static_guards, timeout_s=timeout_s,
                                on_stage=on_stage)
