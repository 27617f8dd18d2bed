"""The closed, versioned set of event types the journal accepts."""

EVENTS_VERSION = 1
"""Bumped when an event's meaning changes; readers refuse journals from a newer version."""

EVENT_TYPES = frozenset(
    {
        "session.created",
        "goal.set",
        "run.started",
        "run.paused",
        "run.resumed",
        "run.stopped",
        "llm.request",
        "llm.response",
        "tool.call",
        "tool.result",
        "attempt.written",
        "eval.finished",
        "profile.finished",
        "ledger.updated",
        "memory.compacted",
        "nudge.received",
        "nudge.acked",
        "checkpoint.written",
        "error",
    }
)
