"""Isolated candidate evaluation: static guards, a trusted harness and a candidate worker, verdict and timing.

Importing this package never imports torch: the caller's process only spawns and watches the evaluation.
"""

from workbench.evaluator.errors import VERDICTS, EvalUsageError
from workbench.evaluator.orchestrate import evaluate
from workbench.evaluator.report import format_result

__all__ = ["VERDICTS", "EvalUsageError", "evaluate", "format_result"]
