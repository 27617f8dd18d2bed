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


class EvalAborted(Exception):
    """The evaluation was stopped from outside (EvaluationService.abort: the run is stopping), so it has no result;
    not the candidate's fault and not the service's."""
