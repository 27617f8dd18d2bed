"""Rebuild a session's state for resume: the session.toml checkpoint plus the journal tail after it."""

from __future__ import annotations

from typing import Any

from workbench.session.state import SessionState, apply


def load_state(files: Any) -> SessionState:
    """The state after the last journaled event.

    The checkpoint is a cache: it is used only when the store says the journal still holds the history it was
    folded from, and when its own last_seq matches checkpoint_seq; otherwise the whole journal is folded.
    """
    state, start = SessionState(), 1
    cached = files.meta.get("state")
    seq = files.meta.get("checkpoint_seq", 0)
    if cached and files.checkpoint_usable():
        candidate = SessionState.from_dict(cached)
        if candidate.last_seq == seq:
            state, start = candidate, seq + 1
    for event in files.read_events(start_seq=start):
        apply(state, event.to_dict())
    return state


def checkpoint_record(state: SessionState) -> dict[str, Any]:
    """What session.toml holds: the meta a person or `sessions` reads at a glance, and the full state."""
    best = state.best_attempt
    record: dict[str, Any] = {
        "task": state.task,
        "agent": state.agent,
        "model": state.model,
        "device": state.device,
        "status": state.status,
        "budget": state.budget,
        "state": state.to_dict(),
    }
    if best is not None:
        record["best"] = {"attempt": best.n, "speedup": best.speedup, "ms": best.ms}
    return record
