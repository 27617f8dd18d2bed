"""A pool over plain Evaluators, for a runtime given an evaluator rather than a pool (tests, scripts).

The runtime only knows the pool contract (workbench.fleet.api). A run from the CLI gets its pool from the fleet
(`workbench.fleet.make_pool`: one EvaluationService per GPU or CPU slot, faults and retiring, Ray across hosts);
`evaluator_pool` puts any Evaluator behind the same contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from workbench.fleet.api import EvalJob, SlotInfo
from workbench.fleet.local import LocalPool
from workbench.fleet.observe import KernelObserver, observe

if TYPE_CHECKING:
    from workbench.agent.evaluation import Evaluator
    from workbench.evaluator.result import EvalResult
    from workbench.tasks import Task


class EvaluatorRunner:
    """A slot runner over an Evaluator (SlotRunner): the job's file of the task, with the held-out flag, and the
    observer's look at a passing held-out check when the job asks."""

    def __init__(self, evaluator: "Evaluator", task: "Task", observer: KernelObserver | None = None,
                 gpu: str | None = None) -> None:
        self.evaluator = evaluator
        self.task = task
        self.observer = observer
        self.gpu = gpu
        """The GPU the observer runs on (the slot's)."""

    def run(self, job: EvalJob) -> "EvalResult":
        """Evaluate the job's attempt file."""
        result = self.evaluator.evaluate(self.task, job.path, heldout=job.heldout)
        if job.observe:
            observe(self.observer, self.task, job.path, self.gpu, result)
        return result

    def abort(self) -> None:
        """Nothing: a plain Evaluator cannot be stopped from outside, so the evaluation runs to its end and the pool
        reports the job cancelled."""

    def close(self) -> None:
        """Close the evaluator."""
        self.evaluator.close()


def evaluator_pool(evaluators: Sequence["Evaluator"], task: "Task", device: str = "cpu",
                   observer: KernelObserver | None = None) -> LocalPool:
    """A pool of one slot per evaluator, named '<device>:<i>' (slot 0 is the reference)."""
    gpus = [str(i) if device == "cuda" else None for i in range(len(evaluators))]
    return LocalPool([(SlotInfo(f"{device}:{i}", device, gpu=gpus[i]),
                       EvaluatorRunner(evaluator, task, observer, gpus[i])) for i, evaluator in enumerate(evaluators)])
