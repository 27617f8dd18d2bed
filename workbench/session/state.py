"""SessionState: everything the UI, the agent and reports show, as a pure fold over journal events."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping

from workbench.journal import events as ev
from workbench.session.atomic import drop_none


def parse_ts(ts: str) -> datetime:
    """Parse the journal's UTC timestamp ('2026-11-29T22:13:17.123Z')."""
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


@dataclass
class Attempt:
    """One kernel version: written once, evaluated zero or more times (the latest result wins)."""

    n: int
    sha256: str
    author: str
    """'agent', 'human' (a person's edit of the kernel file is an attempt too) or 'start' (attempt 1: the kernel
    the session starts from, the task's seed or the --start file)."""
    parent: int | None = None
    note: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    verdict: str | None = None
    message: str = ""
    speedup: float | None = None
    ms: float | None = None
    timing_comparable: bool = False
    shapes: list[dict[str, Any]] = field(default_factory=list)
    written_seq: int = 0
    eval_seq: int | None = None
    slot: str = ""
    """The slot the standing result was measured on ('' in journals from before the fleet)."""
    confirming: bool = False
    """Its candidate result would be a new best, and the held-out check on the reference slot has not come back
    yet: it is not the best until it has."""
    confirmed: bool | None = None
    """Whether its result passed the held-out check on the reference slot; False until then for results from the
    evaluation pool, which can be the best only once confirmed. None: journals from before the pool, whose best
    stood as it was judged (and was demoted by a failed check)."""
    eval_error: str = ""
    """Why its latest evaluation produced no result (the trusted side failed twice, or it was cancelled)."""


@dataclass
class SessionState:
    """The derived state of one session; rebuilt by folding events, cached in session.toml."""

    id: str = ""
    task: str = ""
    agent: str = ""
    model: str | None = None
    device: str = ""
    endpoint: dict[str, Any] = field(default_factory=dict)
    """The model API's endpoint (journal.events.Endpoint) the latest run used; {} for backends without one."""
    created: str = ""
    goal: dict[str, Any] = field(default_factory=dict)
    start_file: str = ""
    """The kernel a run was started from instead of the task's seed (workbench run --start), if any."""
    start_source: str = ""
    """Its text, as journaled in session.created, so a resume rebuilds the same starting point."""
    status: str = "new"
    """new, running, paused, stopped (resumable: budget, user stop, crash) or finished (nothing left to try)."""
    stop_reason: str = ""
    budget: dict[str, Any] = field(default_factory=dict)
    last_seq: int = 0
    last_ts: str = ""
    events: int = 0
    attempts: dict[int, Attempt] = field(default_factory=dict)
    best: int | None = None
    tool_calls: int = 0
    in_flight: dict[str, dict[str, Any]] = field(default_factory=dict)
    """tool.call intents without a tool.result, by call id: on resume these were interrupted."""
    nudges: list[dict[str, Any]] = field(default_factory=list)
    """Every nudge received, with 'acked' and 'active' flags."""
    ledger: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    """The latest compaction summary of any branch (memory.compacted data)."""
    memories: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The latest compaction of each branch, by branch number as text (TOML keys are strings)."""
    branches: int = 1
    """Conversations the latest run drives from the goal (run --branches)."""
    workers: int = 0
    """Evaluation slots of the latest run (0 before the fleet recorded them)."""
    cluster: str = ""
    """How the latest run's slots were made: 'local' or 'ray' ('' before the fleet recorded it)."""
    reference: str = ""
    """The slot that confirms a new best."""
    slots: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Every slot of the latest run by name: its SlotData plus 'state', 'job', 'attempt', 'evaluations' and
    'faults' (a fleet view of the journal)."""
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Evaluations queued or running (eval.queued data, plus 'seq' and 'slot' once started), by job id: on resume
    these were interrupted."""
    jobs_queued: int = 0
    """eval.queued events so far: job ids are never reused."""
    profile: dict[str, Any] = field(default_factory=dict)
    """The latest profile.finished data."""
    errors: list[str] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    api_wait: dict[str, Any] = field(default_factory=dict)
    """While the model API is failing: the latest failed try ({'try', 'retry_in', 'error', 'ts'}), whose retry is
    due retry_in seconds after ts; empty once a reply comes, or the run stops."""
    run_started_ts: str = ""
    """Start of the running interval now open ('' when not running)."""
    elapsed_s: float = 0.0
    """Running time of closed intervals; see elapsed_at() for the live figure."""

    # -- derived views -------------------------------------------------------------------------
    @property
    def best_attempt(self) -> Attempt | None:
        """The best attempt, or None before any attempt evaluated ok."""
        return self.attempts.get(self.best) if self.best is not None else None

    @property
    def current(self) -> Attempt | None:
        """The latest attempt written."""
        return self.attempts[max(self.attempts)] if self.attempts else None

    @property
    def next_attempt(self) -> int:
        """The number the next attempt gets; numbers are never reused."""
        return max(self.attempts, default=0) + 1

    @property
    def evaluated(self) -> int:
        """Attempts with at least one evaluation: what --max-iterations counts."""
        return sum(1 for a in self.attempts.values() if a.verdict is not None)

    def elapsed_at(self, now: datetime | None = None) -> float:
        """Running seconds, counting the open interval up to `now` (the last event when None)."""
        if not self.run_started_ts:
            return self.elapsed_s
        end = now or (parse_ts(self.last_ts) if self.last_ts else parse_ts(self.run_started_ts))
        return self.elapsed_s + max(0.0, (end - parse_ts(self.run_started_ts)).total_seconds())

    def active_nudges(self) -> list[dict[str, Any]]:
        """Nudges the agent must still honour: unacknowledged ones, and persistent ones not revoked."""
        return [n for n in self.nudges if n.get("active")]

    # -- checkpoint (de)serialisation --------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A TOML-safe dict (no None values, string keys) for the session.toml checkpoint."""
        return drop_none(asdict(self) | {"attempts": {str(k): asdict(v) for k, v in self.attempts.items()}},
                         in_lists=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SessionState":
        """Rebuild from to_dict() output."""
        data = dict(data)
        if "memories" not in data and data.get("memory"):
            data["memories"] = {"0": data["memory"]}  # a checkpoint from before branches: its one window is 0's
        attempts = {int(k): Attempt(**v) for k, v in data.pop("attempts", {}).items()}
        known = {f for f in cls.__dataclass_fields__}
        state = cls(**{k: v for k, v in data.items() if k in known})
        state.attempts = attempts
        return state


def _better(candidate: Attempt, incumbent: Attempt | None) -> bool:
    if candidate.verdict != "ok" or candidate.speedup is None or candidate.confirmed is False:
        return False
    if incumbent is None or incumbent.speedup is None:
        return True
    return candidate.speedup > incumbent.speedup


def _recompute_best(state: SessionState) -> int | None:
    best: Attempt | None = None
    for attempt in state.attempts.values():
        if _better(attempt, best):
            best = attempt
    return best.n if best else None


def _close_interval(state: SessionState, ts: str) -> None:
    if state.run_started_ts:
        state.elapsed_s += max(0.0, (parse_ts(ts) - parse_ts(state.run_started_ts)).total_seconds())
    state.run_started_ts = ""


# -- one handler per event type: (state, data, seq, ts) --------------------------------------------------------
Handler = Callable[[SessionState, Any, int, str], None]

HANDLERS: dict[str, Handler] = {}
"""The fold, one small handler per event type (every type in workbench.journal.events.EVENT_TYPES)."""


_on = ev.by_type(HANDLERS)


@_on("session.created")
def _session_created(state: SessionState, data: ev.SessionCreated, seq: int, ts: str) -> None:
    for key in ("id", "task", "agent", "model", "device", "created"):
        if key in data:
            setattr(state, key, data[key])  # type: ignore[literal-required]
    state.budget = dict(data.get("budget", {}))
    state.endpoint = dict(data.get("endpoint", {}))
    state.status = "created"
    start = data.get("start")
    if isinstance(start, Mapping):
        state.start_file, state.start_source = str(start.get("file", "")), str(start.get("source", ""))


@_on("goal.set")
def _goal_set(state: SessionState, data: ev.GoalSet, seq: int, ts: str) -> None:
    state.goal = dict(data)


@_on("run.started")
def _run_started(state: SessionState, data: ev.RunStarted, seq: int, ts: str) -> None:
    state.status, state.stop_reason = "running", ""
    state.api_wait = {}
    state.run_started_ts = ts
    if "budget" in data:
        state.budget = dict(data["budget"])
    if "agent" in data:
        state.agent = data["agent"]
    if "model" in data:
        state.model = data["model"]
    if "endpoint" in data:
        state.endpoint = dict(data["endpoint"])
    state.branches = int(data.get("branches", 1))
    if "slots" in data:
        state.workers = int(data.get("workers", len(data["slots"])))
        state.cluster = data.get("cluster", "local")
        state.reference = data.get("reference", "")
        state.slots = {s["slot"]: {**s, "state": "idle", "job": "", "attempt": None, "evaluations": 0, "faults": []}
                       for s in data["slots"]}


@_on("run.paused")
def _run_paused(state: SessionState, data: ev.RunPaused, seq: int, ts: str) -> None:
    _close_interval(state, ts)
    state.status = "paused"


@_on("run.stopped")
def _run_stopped(state: SessionState, data: ev.RunStopped, seq: int, ts: str) -> None:
    _close_interval(state, ts)
    for slot in state.slots.values():  # the pool is gone; open jobs stay open until a resume re-queues them
        slot.update(job="", attempt=None, state="idle" if slot.get("state") == "busy" else slot.get("state"))
    state.status = "finished" if data.get("final") else "stopped"
    state.stop_reason = data.get("reason", "")
    state.api_wait = {}


@_on("run.resumed")
def _run_resumed(state: SessionState, data: ev.RunResumed, seq: int, ts: str) -> None:
    state.status = "running"
    state.run_started_ts = ts


@_on("tool.call")
def _tool_call(state: SessionState, data: ev.ToolCalled, seq: int, ts: str) -> None:
    state.tool_calls += 1
    state.in_flight[data["call_id"]] = {"tool": data["tool"], "args": data.get("args", {}), "seq": seq}
    if "branch" in data:
        state.in_flight[data["call_id"]]["branch"] = data["branch"]


@_on("tool.result")
def _tool_result(state: SessionState, data: ev.ToolResult, seq: int, ts: str) -> None:
    state.in_flight.pop(data["call_id"], None)


@_on("attempt.written")
def _attempt_written(state: SessionState, data: ev.AttemptWritten, seq: int, ts: str) -> None:
    n = data["attempt"]
    state.attempts[n] = Attempt(n=n, parent=data.get("parent"), sha256=data.get("sha256", ""),
                                author=data.get("author", "agent"), note=data.get("note", ""),
                                params=dict(data.get("params") or {}), source=data.get("source", ""), written_seq=seq)


@_on("eval.finished")
def _eval_finished(state: SessionState, data: ev.EvalFinished, seq: int, ts: str) -> None:
    _job_done(state, data)
    attempt = state.attempts.get(data["attempt"])
    if attempt is None:
        return
    result = data.get("result", {})
    attempt.verdict = result.get("verdict")
    attempt.message = result.get("message", "")
    attempt.speedup = result.get("speedup")
    attempt.timing_comparable = bool(result.get("timing_comparable"))
    attempt.shapes = list(result.get("shapes", []))
    times = [s["ms"] for s in attempt.shapes if s.get("ms") is not None]
    attempt.ms = sum(times) if times else None
    attempt.eval_seq = seq
    attempt.eval_error = ""
    heldout = data.get("check") == "heldout"
    attempt.confirming = bool(data.get("pending")) and not heldout
    if "job" in data:
        attempt.confirmed = bool((data.get("heldout") or {}).get("passed")) if heldout else False
    else:
        attempt.confirmed = None
    if "slot" in data:
        attempt.slot = data["slot"].get("slot", "")
    if state.best == attempt.n:
        state.best = None  # a re-evaluation (or the confirmation on the reference slot) can demote it
    if state.best is None:
        state.best = _recompute_best(state)
    elif _better(attempt, state.best_attempt):
        state.best = attempt.n


def _job_done(state: SessionState, data: ev.EvalFinished | ev.EvalFailed) -> None:
    """A job ended: it leaves the open jobs, and its slot is free again."""
    job = state.jobs.pop(data.get("job", ""), None)
    where = (data.get("slot") or {}).get("slot") or (job or {}).get("slot_taken", "")
    slot = state.slots.get(where)
    if slot is not None and slot.get("job") == data.get("job"):
        slot.update(job="", attempt=None, state="idle" if slot.get("state") == "busy" else slot.get("state"))
        slot["evaluations"] = int(slot.get("evaluations", 0)) + 1


@_on("eval.queued")
def _eval_queued(state: SessionState, data: ev.EvalQueued, seq: int, ts: str) -> None:
    state.jobs_queued += 1
    state.jobs.pop(data.get("requeue_of", ""), None)
    state.jobs[data["job"]] = {**data, "seq": seq}


@_on("eval.started")
def _eval_started(state: SessionState, data: ev.EvalStarted, seq: int, ts: str) -> None:
    info = dict(data.get("slot") or {})
    name = info.get("slot", "")
    job = state.jobs.get(data["job"])
    if job is not None:
        job["slot_taken"] = name
    slot = state.slots.setdefault(name, {**info, "state": "idle", "evaluations": 0, "faults": []})
    slot.update(state="busy", job=data["job"], attempt=data.get("attempt"))


@_on("eval.requeued")
def _eval_requeued(state: SessionState, data: ev.EvalRequeued, seq: int, ts: str) -> None:
    job = state.jobs.get(data.get("job", ""))
    if job is not None:
        job.pop("slot_taken", None)
    slot = state.slots.get((data.get("slot") or {}).get("slot", ""))
    if slot is not None and slot.get("job") == data.get("job"):
        slot.update(job="", attempt=None, state="idle" if slot.get("state") == "busy" else slot.get("state"))


@_on("eval.failed")
def _eval_failed(state: SessionState, data: ev.EvalFailed, seq: int, ts: str) -> None:
    kind = state.jobs.get(data.get("job", ""), {}).get("kind", "candidate")
    _job_done(state, data)
    attempt = state.attempts.get(data.get("attempt", 0))
    if attempt is None:
        return
    if kind == "heldout":
        attempt.confirming = False  # dropped or failed: the attempt stays unconfirmed, never the best
    else:
        attempt.eval_error = data.get("message", "") or "the evaluation produced no result"


@_on("fleet.slot")
def _fleet_slot(state: SessionState, data: ev.FleetSlot, seq: int, ts: str) -> None:
    info = dict(data.get("slot") or {})
    slot = state.slots.setdefault(info.get("slot", ""), {**info, "state": "idle", "evaluations": 0, "faults": []})
    slot["state"] = data.get("state", slot.get("state", "idle"))
    if data.get("message"):
        slot["faults"] = [*slot.get("faults", []), data["message"]]
    if data.get("reference"):
        state.reference = data["reference"]


@_on("profile.finished")
def _profile_finished(state: SessionState, data: ev.ProfileFinished, seq: int, ts: str) -> None:
    state.profile = dict(data)


@_on("nudge.received")
def _nudge_received(state: SessionState, data: ev.NudgeReceived, seq: int, ts: str) -> None:
    state.nudges.append({"id": data["id"], "text": data["text"], "persistent": bool(data.get("persistent")),
                         "seq": seq, "acked": False, "active": True})


@_on("nudge.acked")
def _nudge_acked(state: SessionState, data: ev.NudgeAcked, seq: int, ts: str) -> None:
    for nudge in state.nudges:
        if nudge["id"] == data["id"]:
            nudge["acked"] = True
            nudge["active"] = nudge["persistent"] and not data.get("revoked", False)


@_on("ledger.updated")
def _ledger_updated(state: SessionState, data: ev.LedgerUpdated, seq: int, ts: str) -> None:
    state.ledger = list(data.get("ledger", []))


@_on("memory.compacted")
def _memory_compacted(state: SessionState, data: ev.MemoryCompacted, seq: int, ts: str) -> None:
    state.memory = dict(data)
    state.memories[str(data.get("branch", 0))] = state.memory


@_on("llm.response")
def _llm_response(state: SessionState, data: ev.LlmResponse, seq: int, ts: str) -> None:
    if data.get("ok", True) or not data.get("retry_in"):
        state.api_wait = {}  # a reply, or a failure that waits for nothing (the prompt was too long: compacted)
    else:
        state.api_wait = {"try": data.get("try", 0), "retry_in": data["retry_in"], "error": data.get("error", ""),
                          "ts": ts}
    state.tokens_in += int(data.get("input_tokens", 0))
    state.tokens_out += int(data.get("output_tokens", 0))
    state.cost_usd += float(data.get("cost_usd", 0.0))


@_on("error")
def _error(state: SessionState, data: ev.ErrorRaised, seq: int, ts: str) -> None:
    state.errors.append(data.get("message", ""))


@_on("llm.request", "checkpoint.written")
def _nothing(state: SessionState, data: Mapping[str, Any], seq: int, ts: str) -> None:
    """Events that change no derived state (the memory fold and the UI read them)."""


def apply(state: SessionState, event: Mapping[str, Any]) -> SessionState:
    """Apply one event (a journal record as a dict) to `state` in place and return it."""
    state.last_seq, state.last_ts = event["seq"], event["ts"]
    state.events += 1
    HANDLERS[event["type"]](state, event.get("data") or {}, event["seq"], event["ts"])
    return state


def fold(events: Iterable[Mapping[str, Any]], state: SessionState | None = None) -> SessionState:
    """Fold events onto a copy of `state` (or an empty state): the pure projection the whole app shares."""
    state = copy.deepcopy(state) if state is not None else SessionState()
    for event in events:
        apply(state, event)
    return state
