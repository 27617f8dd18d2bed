"""The closed, versioned set of event types the journal accepts, and the one typed definition of each one's data.

Every writer (runtime, tools, backends), the fold (session.state), the prompts and the TUI take an event's keys
from here. The definitions are TypedDicts over the JSON a line carries, not classes, because a journal written
years ago must still replay: a key is only ever added (total=False where a key may be missing in older journals),
and a change of meaning bumps EVENTS_VERSION.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal, TypedDict, TypeVar

if TYPE_CHECKING:
    from workbench.evaluator.result import EvalResult

EVENTS_VERSION = 1
"""Bumped when an event's meaning changes; readers refuse journals from a newer version."""


# -- content blocks of the model conversation (llm.request deltas, llm.response replies) -----------------------
class TextBlock(TypedDict):
    """Text the model reads or wrote."""

    type: Literal["text"]
    text: str


class SourceRef(TypedDict):
    """Stands for attempt n's source, filled in when a request is built (sources are journaled once)."""

    type: Literal["text"]
    source_of: int


class ToolUseBlock(TypedDict, total=False):
    """A tool call in a model reply; `malformed` says why its arguments could not be read (input is then {})."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    malformed: str


class ToolResultBlock(TypedDict, total=False):
    """The answer to one tool call, in the next user message."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: list[TextBlock | SourceRef]
    is_error: bool


Block = TextBlock | SourceRef | ToolUseBlock | ToolResultBlock


class Message(TypedDict):
    """One turn of the conversation, in the neutral form the journal keeps (a transport maps it to its API)."""

    role: Literal["user", "assistant"]
    content: list[Block]


# -- session and run -----------------------------------------------------------------------------------------
class StartKernel(TypedDict):
    """The kernel a run started from instead of the task's seed (run --start)."""

    file: str
    sha256: str
    source: str


class Endpoint(TypedDict, total=False):
    """Where an LLM backend's model API is and what its tokens cost, as far as the person chose them (--base-url,
    --price, --no-stream): journaled so a resume talks to the same server at the same price. Never a key."""

    base_url: str
    price: list[float]
    """USD per million tokens: [input, output] or [input, output, cached input]."""
    stream: bool
    """False: ask for whole replies instead of server-sent events (servers that cannot stream tool calls)."""


class RunIdentity(TypedDict, total=False):
    """Who runs the session and how: set at creation, and again by every run (a resume may change the budget)."""

    agent: str
    model: str | None
    device: str
    budget: dict[str, Any]
    endpoint: Endpoint
    """Only for backends that take one (the openai backend); absent in journals from before it existed."""


class TaskOrigin(TypedDict, total=False):
    """Where the task was loaded from and the hash of its oracle files (workbench.tasks.hashing): a resume loads
    it from there and refuses a changed oracle unless told to accept it."""

    task_dir: str
    task_hash: dict[str, Any]


class SessionCreated(RunIdentity, TaskOrigin, total=False):
    id: str
    task: str
    created: str
    start: StartKernel


class TaskView(TypedDict, total=False):
    """A task as the agent may see it (workbench.tasks.model.Task.public_view): no held-out shape, names included."""

    name: str
    description: str
    entry: str
    outputs: list[str]
    tolerance: dict[str, Any]
    roofline: dict[str, Any]
    forbidden: dict[str, list[str]]
    plausible_speedup: float
    graph_timing: bool
    shapes: dict[str, list[dict[str, Any]]]
    files: dict[str, str | None]


class GoalSet(TaskView, TaskOrigin, total=False):
    """The goal contract pinned for the session: the task's public view plus device, baseline, metric, budget; a
    resume that accepted a changed task journals a new one, naming the changed files."""

    task_changed: list[str]

    task: str
    device: str
    baseline: str
    metric: str
    budget: dict[str, Any]


class SlotData(TypedDict, total=False):
    """Where an evaluation runs (workbench.fleet.api.SlotInfo.to_dict): every result names its slot."""

    slot: str
    device: str
    gpu: str | None
    host: str
    gpu_name: str | None


class RunStarted(RunIdentity, total=False):
    resumed: bool
    workers: int
    """Evaluation slots the run started with (--workers); absent in journals from before the fleet."""
    cluster: str
    """'local' or 'ray' (--cluster)."""
    branches: int
    """Conversations run from the goal at once (--branches); absent means 1."""
    slots: list[SlotData]
    """Every slot of the run's pool, in the pool's order."""
    reference: str
    """The slot that confirms a new best (candidate and baseline timed on one GPU in one run)."""


class RunPaused(TypedDict):
    pass


class RunResumed(TypedDict):
    pass


class _RunStoppedBase(TypedDict):
    reason: str
    final: bool
    """True when the agent finished (nothing left to try); a budget, a stop or an error leave it resumable."""


class RunStopped(_RunStoppedBase, total=False):
    interrupted: list[str]
    """The jobs (eval.queued) still queued or running when the run stopped: aborted, queued again on resume."""


# -- the model conversation ----------------------------------------------------------------------------------
class LlmRequest(TypedDict, total=False):
    """One request: only the user message(s) it adds (the delta); the rest of the context is the fold before it."""

    branch: int
    """The conversation it belongs to (run --branches); absent means 0, the only one before branches existed."""
    turn: int
    model: str
    max_tokens: int
    prompt_version: int
    system_sha256: str
    delta: list[Message]
    context_tokens: int
    budget_tokens: int


LlmResponse = TypedDict("LlmResponse", {
    "branch": int,
    "ok": bool,
    "turn": int,
    "try": int,
    # ok: the reply
    "content": list[Block],
    "stop_reason": str | None,
    "id": str | None,
    "model": str | None,
    "input_tokens": int,
    "output_tokens": int,
    "cache_creation_input_tokens": int,
    "cache_read_input_tokens": int,
    "cost_usd": float,
    "priced": bool,
    "ms": float,
    # not ok: one failed try and the wait chosen before the next
    "error": str,
    "status": int,
    "retry_in": float,
    "retry_after": bool,
}, total=False)
"""One try of a request: a reply (ok) or a failure with the wait before the next try."""


# -- tools and attempts --------------------------------------------------------------------------------------
class ToolEvent(TypedDict, total=False):
    """The call a tool.call or tool.result is about."""

    call_id: str
    tool: str
    ref: str
    """The backend's own id for the call (an LLM's tool_use id)."""
    branch: int
    """The conversation that made the call (absent: 0, or the person's own command)."""


class ToolCalled(ToolEvent, total=False):
    """A tool call's intent, journaled before it runs (a source argument as its hash and length)."""

    args: dict[str, Any]


class ToolResult(ToolEvent, total=False):
    """A tool call's result: `data` is the tool's own journaled data (its ToolOutcome), enough to render it again."""

    ok: bool
    summary: str
    data: dict[str, Any]
    error: str
    aborted: bool


class AttemptWritten(TypedDict, total=False):
    attempt: int
    parent: int | None
    sha256: str
    author: str
    """'agent', 'human' (an edit of the session's kernel.py) or 'start' (the kernel the session starts from)."""
    note: str
    params: dict[str, Any]
    source: str


class HeldoutSummary(TypedDict, total=False):
    shapes: int
    passed: bool
    speedup: float | None


class EvalQueued(TypedDict, total=False):
    """An evaluation handed to the run's pool (journaled before the pool sees it)."""

    job: str
    """Unique within the session ('j00012'); eval.started, eval.finished and eval.failed name it."""
    attempt: int
    kind: Literal["heldout", "profile", "candidate"]
    """What it is for, which sets its priority: the held-out check (and confirmation) of a new best first."""
    heldout: bool
    slot: str
    """Pinned to this slot (the reference slot that confirms a new best); absent: any slot."""
    branch: int
    """The conversation whose call queued it (its results reach that conversation); absent: none."""
    call: str
    """The tool call that queued it."""
    requeue_of: str
    """On resume: the job the crash (or stop) interrupted, which this one replaces."""


class EvalStarted(TypedDict, total=False):
    """A slot took the job."""

    job: str
    attempt: int
    slot: SlotData


class EvalRequeued(TypedDict, total=False):
    """The slot's trusted side failed on the job (a GPU or service fault, a lost Ray actor): it left that slot and
    waits for another (its eval.started has no end of its own; the job's next eval.started or its end follows)."""

    job: str
    attempt: int
    slot: SlotData
    """The slot it left."""
    message: str


class EvalFailed(TypedDict, total=False):
    """The job ended without a result: the trusted side failed on it twice, or it was cancelled."""

    job: str
    attempt: int
    message: str
    cancelled: bool
    slot: SlotData


class EvalFinished(TypedDict, total=False):
    """An evaluation of one attempt; with check 'heldout', the gate of a new best (public part of its result)."""

    attempt: int
    result: EvalResult
    check: Literal["heldout"]
    heldout: HeldoutSummary
    observed: dict[str, Any]
    job: str
    """The pool job that produced it (absent in journals from before the fleet)."""
    slot: SlotData
    """Where it was measured."""
    pending: bool
    """A candidate result that would be a new best: it stands only once the held-out check on the reference slot
    (the eval.finished with check 'heldout' that follows) confirms it."""


class FleetSlot(TypedDict, total=False):
    """A slot's state changed: faulted (its service replaced), retired, skipped (a GPU busy with someone else's
    job); or the reference moved to another slot."""

    slot: SlotData
    state: Literal["idle", "busy", "faulted", "retired", "skipped"]
    message: str
    reference: str
    """Set when this change moved the reference slot: the new one."""


class ProfileFinished(TypedDict, total=False):
    """A kernel table and roofline from an evaluation ('evaluation'), or an Nsight Compute run ('ncu')."""

    attempt: int
    source: Literal["evaluation", "ncu"]
    against: int
    deltas: list[str]
    ncu: dict[str, Any]
    headline: str
    summary: str


class LedgerChange(TypedDict, total=False):
    action: Literal["add", "update", "evidence"]
    id: str
    attempt: int


class LedgerUpdated(TypedDict):
    ledger: list[dict[str, Any]]
    change: LedgerChange


class MemoryCompacted(TypedDict, total=False):
    branch: int
    """The conversation whose window this compacts (absent: 0)."""
    number: int
    kind: Literal["messages", "tools"]
    replaced: list[int]
    """[first seq, last seq] the summary stands for."""
    summary: str
    plan: str
    dropped: list[str]
    entries_dropped: int
    audit: dict[str, Any]
    tokens_before: int
    tokens_after: int
    limit: int
    turn: int
    last_request_seq: int


# -- the person ----------------------------------------------------------------------------------------------
class NudgeReceived(TypedDict, total=False):
    id: str
    text: str
    persistent: bool
    origin: Literal["tui", "inbox", "answer"]


class NudgeAcked(TypedDict, total=False):
    id: str
    note: str
    revoked: bool


class CheckpointWritten(TypedDict):
    seq: int


class ErrorRaised(TypedDict):
    message: str


EventType = Literal["session.created", "goal.set", "run.started", "run.paused", "run.resumed", "run.stopped",
                    "llm.request", "llm.response", "tool.call", "tool.result", "attempt.written", "eval.queued",
                    "eval.started", "eval.requeued", "eval.finished", "eval.failed", "fleet.slot", "profile.finished",
                    "ledger.updated", "memory.compacted", "nudge.received", "nudge.acked", "checkpoint.written",
                    "error"]

EVENT_DATA: dict[str, type] = {
    "session.created": SessionCreated,
    "goal.set": GoalSet,
    "run.started": RunStarted,
    "run.paused": RunPaused,
    "run.resumed": RunResumed,
    "run.stopped": RunStopped,
    "llm.request": LlmRequest,
    "llm.response": LlmResponse,
    "tool.call": ToolCalled,
    "tool.result": ToolResult,
    "attempt.written": AttemptWritten,
    "eval.queued": EvalQueued,
    "eval.started": EvalStarted,
    "eval.requeued": EvalRequeued,
    "eval.finished": EvalFinished,
    "eval.failed": EvalFailed,
    "fleet.slot": FleetSlot,
    "profile.finished": ProfileFinished,
    "ledger.updated": LedgerUpdated,
    "memory.compacted": MemoryCompacted,
    "nudge.received": NudgeReceived,
    "nudge.acked": NudgeAcked,
    "checkpoint.written": CheckpointWritten,
    "error": ErrorRaised,
}
"""Each event type and the TypedDict of its data."""

EVENT_TYPES = frozenset(EVENT_DATA)
"""The types the journal accepts: a line of any other type is corruption (or a newer workbench)."""


Reader = TypeVar("Reader", bound=Callable[..., Any])


def by_type(table: dict[str, Reader]) -> Callable[..., Callable[[Reader], Reader]]:
    """A decorator that files a function under event types in `table`: `on = by_type(T)`, then `@on("goal.set")`.

    Each reader of the journal (the fold, the TUI's summaries) is one such table, with one function per type.
    """
    def on(*types: str) -> Callable[[Reader], Reader]:
        def register(reader: Reader) -> Reader:
            for kind in types:
                table[kind] = reader
            return reader
        return register
    return on
