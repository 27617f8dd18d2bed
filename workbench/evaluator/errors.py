"""Evaluator error types and the closed set of verdicts."""

from __future__ import annotations

VERDICTS = ("ok", "compile_error", "incorrect", "forbidden", "timeout", "crash", "implausible")
"""Every verdict a result can carry (the evaluator JSON contract)."""


class EvalUsageError(Exception):
    """The evaluation could not start for a reason outside the candidate (missing file, bad device, no CUDA).

    The CLI maps it to exit status 2.
    """


class EvalServiceError(Exception):
    """The trusted side failed twice on one evaluation (the service died, hung, or its baseline or oracle failed),
    with a restart in between: not the candidate's fault. The message says what happened both times."""


class EvalCancelled(Exception):
    """The owner aborted the evaluation in progress (EvaluationService.cancel): the candidate was stopped and nothing
    was judged. The message says what the evaluation was doing."""
