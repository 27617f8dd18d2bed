"""The Backend protocol (everything the runtime uses of a backend) and the narrow context a backend runs in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol

from workbench.agent.memory import DEFAULT_CONTEXT_TOKENS, estimate_tokens
from workbench.agent.prompts import goal_text
from workbench.journal.events import NudgeReceived
from workbench.session.state import SessionState
from workbench.tasks import Task

if TYPE_CHECKING:
    from workbench.agent.budget import Budget
    from workbench.agent.memory import SessionMemory
    from workbench.journal import Event

MemoryKind = Literal["messages", "tools"]
"""'messages': an LLM conversation folded from llm.* events; 'tools': one line per tool call and result."""


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
    """The backend ends the run; `reason` is shown to the person and journaled."""

    reason: str
    final: bool = True
    """True: nothing left to try. False: the backend cannot go on now (the model API kept failing past
    --max-api-wait); the run stops resumable, as at a budget."""


@dataclass(frozen=True)
class BackendContext:
    """What the runtime gives a backend for one run, and nothing more (a backend never sees the runtime)."""

    emit: Callable[[str, dict[str, Any]], "Event"]
    """Journal an event (llm.request, llm.response) and fold it into the state and the memory."""
    notify: Callable[[str, str], None]
    """A transient notice for the person (text, severity); not journaled."""
    wait: Callable[[float], bool]
    """Sleep up to that many seconds unless the run is stopped; True when it was (retry waits)."""
    compact: Callable[..., "Event | None"]
    """compact(extra_tokens, limit=None): journal a memory.compacted when the context would pass the budget (or
    `limit`); the event, or None when nothing needed to go."""
    memory: "SessionMemory"
    """The context window, a fold of the journal kept in step by emit."""
    budget: "Budget"
    """The run's limits (read only)."""
    context_limit: int
    """The compaction budget in force: the run's --context-budget, else the backend's own."""


class Backend(Protocol):
    """A strategy. It keeps no state the journal cannot rebuild, so resume needs nothing but the journal."""

    name: str
    """The registry name, journaled with the session ('tuner', 'claude')."""
    model: str | None
    memory_kind: MemoryKind
    seed_source: str
    """The kernel the session starts from (the task's seed, a --start file, or what the journal says)."""
    context_tokens: int
    """Default compaction budget (tokens), when the run sets none."""

    def bind(self, ctx: BackendContext) -> None:
        """Called when a run starts, before the first step."""
        ...

    def context_overhead(self, state: SessionState) -> int:
        """Estimated tokens of what every request carries outside the window (for the compaction budget)."""
        ...

    def next_action(self, state: SessionState, task: Task) -> ToolCall | Finish | None:
        """Choose the next step; None means nothing this step (a retry wait cut short by a stop)."""
        ...

    def acknowledge(self, nudge: NudgeReceived, state: SessionState, task: Task) -> str:
        """Take in a nudge at a step boundary; return what the backend will do about it (journaled)."""
        ...


class StepBackend:
    """A backend that decides from the session state alone, with no conversation of its own (the tuner, scripts).

    Subclasses set `name` and implement next_action and acknowledge.
    """

    name: str
    model: str | None = None
    memory_kind: MemoryKind = "tools"
    context_tokens: int = DEFAULT_CONTEXT_TOKENS

    def __init__(self, seed_source: str) -> None:
        self.seed_source = seed_source
        """The kernel the session starts from (the task's seed.py unless the person chose another)."""

    def bind(self, ctx: BackendContext) -> None:
        """Nothing to keep: every decision is made from the state."""

    def context_overhead(self, state: SessionState) -> int:
        """The goal contract, which a model reading this window would also be shown."""
        return estimate_tokens(goal_text(state.goal))

    def next_action(self, state: SessionState, task: Task) -> ToolCall | Finish | None:
        """Choose the next step."""
        raise NotImplementedError

    def acknowledge(self, nudge: NudgeReceived, state: SessionState, task: Task) -> str:
        """Say what the backend does about a nudge."""
        raise NotImplementedError
