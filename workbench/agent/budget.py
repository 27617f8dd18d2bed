"""Run budgets: a run stops at the first one reached and stays resumable with a new budget."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Mapping

from workbench.session.state import Attempt, SessionState


@dataclass(frozen=True)
class Budget:
    """Limits for one run; None means unlimited. Counts are over the whole session, not just this run."""

    max_iterations: int | None = None
    """Attempts evaluated (kernel versions)."""
    max_tool_calls: int | None = None
    max_hours: float | None = None
    """Running time, paused time excluded."""
    max_cost: float | None = None
    """US dollars of model usage (LLM backends)."""
    plateau: int | None = None
    """Stop after this many evaluated attempts in a row without a new best."""
    roofline_fraction: float | None = None
    """Stop once the best attempt reaches this fraction of the roofline (sum of floor_ms / sum of ms, 0-1]."""
    context_tokens: int | None = None
    """Not a stop: the model-context size (estimated tokens) past which older turns are compacted."""
    max_api_wait: float | None = None
    """Seconds the model API may go on failing (continuously) before the run stops, checked by an LLM backend between
    its retries; None: the backend's default (RetryPolicy.max_api_wait)."""

    def to_dict(self) -> dict[str, Any]:
        """The set limits only (TOML has no null)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Budget":
        """Inverse of to_dict; unknown keys are ignored so older checkpoints still load."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def exceeded(self, state: SessionState, now: datetime | None = None) -> str | None:
        """The first limit reached, as a phrase for the stop reason, or None (`now` is the live clock)."""
        if self.max_iterations is not None and state.evaluated >= self.max_iterations:
            return f"max iterations ({self.max_iterations}) reached"
        if self.max_tool_calls is not None and state.tool_calls >= self.max_tool_calls:
            return f"max tool calls ({self.max_tool_calls}) reached"
        if self.max_hours is not None and state.elapsed_at(now) >= self.max_hours * 3600:
            return f"max hours ({self.max_hours:g}) reached"
        if self.max_cost is not None and state.cost_usd >= self.max_cost:
            return f"max cost (${self.max_cost:g}) reached"
        if self.plateau is not None:
            stale = attempts_since_best(state)
            if stale >= self.plateau:
                return f"plateau: no improvement in {stale} attempts"
        if self.roofline_fraction is not None:
            fraction = roofline_fraction(state.best_attempt)
            if fraction is not None and fraction >= self.roofline_fraction:
                return f"roofline: best reaches {fraction:.0%} of the roofline (target {self.roofline_fraction:.0%})"
        return None


    def saturated(self, state: SessionState, in_flight: int) -> bool:
        """Whether the candidate evaluations in flight bring the evaluated attempts to --max-iterations: nothing
        new should start, the run waits for them (with several slots busy a run would otherwise overshoot)."""
        return self.max_iterations is not None and in_flight > 0 and \
            state.evaluated + in_flight >= self.max_iterations


def attempts_since_best(state: SessionState) -> int:
    """Evaluated attempts written after the best one (all evaluated attempts while there is no best)."""
    best = state.best
    return sum(1 for a in state.attempts.values() if a.verdict is not None and (best is None or a.n > best))


def roofline_fraction(attempt: Attempt | None) -> float | None:
    """How close an attempt is to the roofline floor: sum(floor_ms) / sum(ms) over its shapes.

    None when the timing is not comparable (the Triton interpreter) or a shape lacks a floor or a time, because a
    fraction of a meaningless time would stop a run for nothing.
    """
    if attempt is None or not attempt.timing_comparable or not attempt.shapes:
        return None
    floors = [s.get("floor_ms") for s in attempt.shapes]
    times = [s.get("ms") for s in attempt.shapes]
    if any(not isinstance(v, (int, float)) for v in floors + times) or sum(times) <= 0:
        return None
    return sum(floors) / sum(times)
