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

if TYPE_CHECKING:
    from workbench.agent.evaluation import Evaluator
    from workbench.evaluator.result import EvalResult
    from workbench.tasks import Task


class EvaluatorRunner:
    """A slot runner over an Evaluator (SlotRunner): the job's file of the task, with the held-out flag."""

    def __init__(self, evaluator: "Evaluator", task: "Task") -> None:
        self.evaluator = evaluator
        self.task = task

    def run(self, job: EvalJob) -> "EvalResult":
        """Evaluate the job's attempt file."""
        return self.evaluator.evaluate(self.task, job.path, heldout=job.heldout)

    def abort(self) -> None:
        """Nothing: a plain Evaluator cannot be stopped from outside, so the evaluation runs to its end and the pool
        reports the job cancelled."""

    def close(self) -> None:
        """Close the evaluator."""
        self.evaluator.close()


def evaluator_pool(evaluators: Sequence["Evaluator"], task: "Task", device: str = "cpu") -> LocalPool:
    """A pool of one slot per evaluator, named '<device>:<i>' (slot 0 is the reference)."""
    return LocalPool([(SlotInfo(f"{device}:{i}", device, gpu=str(i) if device == "cuda" else None),
                       EvaluatorRunner(evaluator, task)) for i, evaluator in enumerate(evaluators)])
