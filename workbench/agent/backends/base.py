"""The Backend protocol: one decision per step, made from the session state alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from workbench.session.state import SessionState
from workbench.tasks import Task


@dataclass(frozen=True)
class ToolCall:
    """The backend wants this tool run with these arguments."""

    tool: str
    args: dict[str, Any] = field(default_factory=dict)
    ref: str | None = None
    """The backend's own id for the call (an LLM's tool_use id), journaled so the result can be matched to it."""
    error: str | None = None
    """Set when the call could not even be parsed (malformed JSON from a model): journaled as a failed call."""


@dataclass(frozen=True)
class Finish:
    """The backend has nothing left to try; `reason` is shown to the person and journaled."""

    reason: str


class Backend(Protocol):
    """A strategy. It keeps no state the journal cannot rebuild, so resume needs nothing but the journal.

    Optional members the runtime uses when present: ``memory_kind`` ("messages" for LLM backends, whose context
    is built from llm.* events; "tools" otherwise), ``bind(runtime)`` (called when a run starts, so the backend
    can journal llm.* events through runtime.emit and read runtime.memory), ``context_overhead(state)`` (tokens
    of the pinned prefix, for the compaction budget) and ``context_tokens`` (its default compaction budget).
    ``next_action`` may return None to mean "nothing this step" (e.g. a retry wait cut short by a stop).
    """

    name: str
    model: str | None

    def next_action(self, state: SessionState, task: Task) -> ToolCall | Finish | None:
        """Choose the next step."""

    def acknowledge(self, nudge: dict[str, Any], state: SessionState, task: Task) -> str:
        """Take in a nudge at a step boundary; return what the backend will do about it (journaled)."""
