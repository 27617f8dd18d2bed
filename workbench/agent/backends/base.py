"""The Backend protocol (everything the runtime uses of a backend) and the narrow context a backend runs in."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol, TypeVar

from workbench.agent.memory import DEFAULT_CONTEXT_TOKENS, estimate_tokens
from workbench.agent.prompts import goal_text
from workbench.journal.events import NudgeReceived
from workbench.session.state import SessionState
from workbench.tasks import Task

if TYPE_CHECKING:
    from workbench.agent.budget import Budget
    from workbench.agent.memory import SessionMemory
    from workbench.journal import Event
    from workbench.journal.events import Endpoint

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
class Wait:
    """Nothing to do until something in flight comes back (an evaluation, a model reply, a retry's wait): the
    runtime journals what arrives meanwhile and asks again. `reason` says which (for tests and debugging)."""

    reason: str
    until: float | None = None
    """time.monotonic() by which to ask again even if nothing comes back (a retry's wait ends); None: only on news."""


T = TypeVar("T")


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
    offload: Callable[[Callable[[], Any]], "Future[Any]"] = lambda fn: _done(fn)
    """Run a blocking call (a model request) off the journal thread; its Future resolves there. The backend
    journals what comes of it from next_action, on the runtime's thread, so branches never wait on each other."""
    workers: int = 1
    """Evaluation slots that take candidates: how many evaluations it pays to keep in flight."""
    branch: int = 0
    """Which of the run's conversations this backend is (run --branches)."""
    branches: int = 1
    """How many conversations the run drives from the goal."""


def _done(fn: Callable[[], T]) -> "Future[T]":
    """A Future of fn() run here and now (a context without a runtime: tests, scripts)."""
    future: Future[T] = Future()
    try:
        future.set_result(fn())
    except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the future, as a thread would
        future.set_exception(exc)
    return future


class Backend(Protocol):
    """A strategy. It keeps no state the journal cannot rebuild, so resume needs nothing but the journal."""

    name: str
    """The registry name, journaled with the session ('tuner', 'claude')."""
    model: str | None
    endpoint: "Endpoint | None"
    """Where its model API is (base URL, price), journaled with each run so a resume talks to the same server;
    None for a backend that takes no endpoint."""
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

    def next_action(self, state: SessionState, task: Task) -> ToolCall | Finish | Wait | None:
        """Choose the next step without blocking: a tool call, a finish, or Wait while something is in flight;
        None means nothing this step."""
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
    endpoint: "Endpoint | None" = None
    memory_kind: MemoryKind = "tools"
    context_tokens: int = DEFAULT_CONTEXT_TOKENS

    def __init__(self, seed_source: str) -> None:
        self.seed_source = seed_source
        """The kernel the session starts from (the task's seed.py unless the person chose another)."""
        self.workers = 1
        """Evaluation slots of the run (from the context): how many evaluations to keep in flight."""

    def bind(self, ctx: BackendContext) -> None:
        """Keep the run's slot count; every decision is made from the state."""
        self.workers = ctx.workers

    def context_overhead(self, state: SessionState) -> int:
        """The goal contract, which a model reading this window would also be shown."""
        return estimate_tokens(goal_text(state.goal))

    def next_action(self, state: SessionState, task: Task) -> ToolCall | Finish | Wait | None:
        """Choose the next step."""
        raise NotImplementedError

    def acknowledge(self, nudge: NudgeReceived, state: SessionState, task: Task) -> str:
        """Say what the backend does about a nudge."""
        raise NotImplementedError
