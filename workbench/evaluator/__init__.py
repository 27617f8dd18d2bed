"""Isolated candidate evaluation: static guards, a trusted evaluation service and fresh candidate processes.

Importing this package never imports torch: the caller's process only spawns and watches the evaluation.
EvaluationService keeps one trusted process per device for a whole run; evaluate() is the one-shot form.
"""

from workbench.evaluator.errors import VERDICTS, EvalCancelled, EvalServiceError, EvalUsageError
from workbench.evaluator.orchestrate import evaluate
from workbench.evaluator.report import format_result
from workbench.evaluator.service import EvaluationService, ServiceHealth

__all__ = ["VERDICTS", "EvalCancelled", "EvalServiceError", "EvalUsageError", "EvaluationService", "ServiceHealth",
           "evaluate", "format_result"]
