"""AgentRuntime: the step loop every backend shares; every effect is journaled before anyone reacts to it.

The runtime keeps the loop and the journal writer. Its collaborators each do one job: CommandDesk (commands,
nudges, the inbox, answers to questions), WorkingCopy (the person's edits of kernel.py), Evaluations (the run's
evaluation pool, the journal cache, the held-out gate, profiles) and Checkpoints. Tools get a ToolContext and
backends a BackendContext: narrow views, never the runtime itself.

Nothing the loop waits for blocks it. Evaluations run on the pool's slots, and the loop journals what the pool
reports at every step boundary and while it waits; an evaluate call that waits for results is left open (Deferred)
and closed when they are in; a model request runs on a thread of its own (BackendContext.offload) and its reply is
journaled from here. So K branches (run --branches) never wait on each other's model calls or evaluations, and
this thread stays the only one that writes the journal.

A run stops at a step boundary when its `stop` event is set (the TUI's q) or `request_stop` says why (a signal);
the evaluations in flight are then aborted (the pool is closed, killing their processes), run.stopped names them and
the reason, and the next resume queues them again.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from workbench.agent.backends.base import Backend, BackendContext, Finish, ToolCall, Wait
from workbench.agent.budget import Budget
from workbench.agent.checkpoints import Checkpoints
from workbench.agent.commands import Command, CommandDesk
from workbench.agent.edits import WorkingCopy, WorkingCopyError
from workbench.agent.evaluation import Evaluated, Evaluations, Evaluator
from workbench.agent.memory import SessionMemory, plan_compaction
from workbench.agent.sink import FleetView, NullSink, RunSink
from workbench.agent.slots import evaluator_pool
from workbench.agent.tools import TOOLS, Deferred, ToolContext, ToolError, check_args, link_evidence
from workbench.agent.tunables import TunablesError, read_declared
from workbench.journal import Event
from workbench.journal.events import AttemptWritten, RunStarted, RunStopped, ToolCalled, ToolResult
from workbench.session.revisions import sha256_text
from workbench.session.state import SessionState, apply

if TYPE_CHECKING:
    from workbench.fleet.api import EvaluationPool
    from workbench.fleet.observe import KernelObserver
    from workbench.session.store import SessionFiles
    from workbench.tasks import Task

IDLE_S = 0.2
"""Longest wait for the pool between two looks at commands and the stop event (the pause loop's slice too)."""
FLEET_PHASE_S = 0.5
"""Shortest interval between two fleet views that differ only in an evaluation's phase."""


def _compact_args(args: Any) -> dict[str, Any]:
    """Tool arguments as journaled in tool.call: kernel sources are journaled once, in attempt.written."""
    if not isinstance(args, dict):
        return {"invalid": repr(args)[:200]}
    out = dict(args)
    if isinstance(out.get("source"), str):
        source = out.pop("source")
        out["source_sha256"], out["source_chars"] = sha256_text(source), len(source)
    return out


@dataclass
class Branch:
    """One conversation of the run: its backend and its own context window (memory, compaction, turns)."""

    number: int
    backend: Backend
    memory: SessionMemory
    finished: str | None = None
    """The backend's finish reason, once it has finished in this run."""
    final: bool = True
    """False when it finished because it cannot go on now (Finish.final: the model API kept failing): the run stops
    resumable."""


@dataclass(frozen=True)
class OpenCall:
    """A tool call journaled and waiting for evaluations (Deferred); the loop closes it once they are in."""

    call_id: str
    tool: str
    ref: str | None
    branch: int | None
    deferred: Deferred


class AgentRuntime:
    """Runs one backend (or K branches of one) against one session until a budget, a finish, a stop or an error.

    The runtime owns the session's journal writer. It is driven from one thread (the TUI's worker or the
    headless main thread) and talks to the outside only through the RunSink and the command queue.

    Args:
        backend: the strategy, or one backend per branch (run --branches K): K conversations from one goal, each
            with its own window, sharing the ledger, the best and the nudges.
        evaluator: evaluates every attempt on a pool of one slot, made for each run (tests, scripts).
        pool: the run's evaluation slots (the CLI's --workers / --cluster), closed when the run ends.
        reference: the slot that confirms a new best (default: the pool's first).
        cluster: how the pool was made ('local' or 'ray'), journaled in run.started.
        kernel_observer: with evaluator, the slot's look at a new best's kernels from outside (workbench.fleet.observe);
            a pool's slots have their own (make_pool's observer).
    """

    def __init__(
        self,
        files: "SessionFiles",
        state: SessionState,
        task: "Task",
        backend: Backend | Sequence[Backend],
        *,
        device: str,
        budget: Budget,
        evaluator: Evaluator | None = None,
        pool: "EvaluationPool | None" = None,
        reference: str | None = None,
        cluster: str = "local",
        checkpoint_every: int = 200,
        kernel_observer: "KernelObserver | None" = None,
    ) -> None:
        if (evaluator is None) == (pool is None):
            raise ValueError("AgentRuntime: pass an evaluator or a pool, not both or neither")
        if kernel_observer is not None and pool is not None:
            raise ValueError("AgentRuntime: a pool's slots run their own observer (make_pool(observer=...))")
        backends = list(backend) if isinstance(backend, (list, tuple)) else [backend]
        self.files = files
        """The session folder (SessionFiles) holding the journal writer."""
        self.state = state
        """Live state: the fold of every event journaled so far."""
        self.task = task
        self.backend = backends[0]
        """The first branch's backend (the only one without --branches): it acknowledges nudges."""
        self.device = device
        self.budget = budget
        self.cluster = cluster
        self._sink: RunSink = NullSink()
        self._stop = threading.Event()
        self._stop_lock = threading.Lock()
        self._stop_reason = ""
        """Why request_stop() stopped the run ('' for a plain stop event: the person's q)."""
        self._call_id = ""
        self._call_branch: int | None = None
        self.branches = [Branch(i, b, SessionMemory.load(files, state, b.memory_kind, branch=i))
                         for i, b in enumerate(backends)]
        """The run's conversations; each memory is a fold of the journal kept in step by emit()."""
        self.memory = self.branches[0].memory
        """The first branch's context window."""
        self.commands = CommandDesk(state=state, emit=self.emit, take_inbox=files.take_inbox,
                                    acknowledge=lambda nudge: self.backend.acknowledge(nudge, self.state, task))
        """Commands, nudges and answers, applied at step boundaries."""
        self.working_copy = WorkingCopy(files.dir / "kernel.py", state)
        """sessions/<id>/kernel.py, for the person to edit in their own editor."""
        self._pools: Callable[[], "EvaluationPool"] = (
            (lambda: evaluator_pool([evaluator], task, device if device in ("cpu", "cuda") else "cpu",
                                    observer=kernel_observer))
            if evaluator is not None else self._once(pool))
        self._reference = reference
        self.evaluations = self._evaluations()
        """Evaluates attempts on the run's pool; closed when a run ends (the next run makes a new one)."""
        self._pool_open = True
        self.checkpoints = Checkpoints(files, self.emit, every=checkpoint_every, last_seq=state.last_seq)
        self.tool_context = ToolContext(
            state=state, task=task, device=device, seed_source=self.backend.seed_source, session_dir=Path(files.dir),
            emit=self.emit, write_attempt=self.write_attempt, attempt_path=self.attempt_path,
            evaluate=lambda n, force=False: self.evaluations.request(n, force=force, branch=self._call_branch,
                                                                      call=self._call_id),
            final=lambda n: self.evaluations.final(n),
            ask=lambda question: self.commands.ask(question, self._call_id))
        """What every tool runs against."""
        self._open: dict[str, OpenCall] = {}
        """Tool calls waiting for evaluations, by call id."""
        self._fleet_shown: tuple[Any, Any, float] = ((), (), 0.0)
        """(jobs, phases, when a phase change may next be sent) of the fleet view sent last."""

    @staticmethod
    def _once(pool: "EvaluationPool | None") -> Callable[[], "EvaluationPool"]:
        given = [pool]

        def take() -> "EvaluationPool":
            if not given:
                raise RuntimeError("the evaluation pool given to this runtime was closed by its run; make a new "
                                   "runtime (or pass evaluator=) to run again")
            return given.pop()  # type: ignore[return-value]

        return take

    def _evaluations(self) -> Evaluations:
        return Evaluations(self._pools(), task=self.task, state=self.state, files=self.files, emit=self.emit,
                           attempt_path=self.attempt_path, reference=self._reference)

    # -- the loop ------------------------------------------------------------------------------
    def run(self, stop: threading.Event, commands: "queue.Queue[Command] | None" = None,
            sink: RunSink | None = None) -> str:
        """Run until something ends the run; returns the stop reason (also journaled as run.stopped)."""
        self._sink = self.commands.sink = sink or NullSink()
        with self._stop_lock:
            self._stop = stop
            if self._stop_reason:  # asked before the run began
                stop.set()
        commands = commands if commands is not None else queue.Queue()
        if not self._pool_open:
            self.evaluations, self._pool_open = self._evaluations(), True
        resumed = self.state.status not in ("new", "created")
        for branch in self.branches:
            branch.finished, branch.final = None, True
            branch.backend.bind(self._context(branch))
        slots = self.evaluations.slots()
        started = RunStarted(budget=self.budget.to_dict(), resumed=resumed, agent=self.backend.name,
                             model=self.backend.model, device=self.device, workers=len(slots), cluster=self.cluster,
                             slots=[s.to_dict() for s in slots], reference=self.evaluations.reference)  # type: ignore[typeddict-item]
        if len(self.branches) > 1:
            started["branches"] = len(self.branches)
        if self.backend.endpoint is not None:
            started["endpoint"] = self.backend.endpoint
        self.emit("run.started", dict(started))
        try:
            self._recover_in_flight()
            self._write_start()
            reason, final = self._loop(stop, commands)
            self._settle(stop)
        except BaseException as exc:
            self.emit("error", {"message": f"{type(exc).__name__}: {exc}"})
            self.emit("run.stopped", dict(RunStopped(reason=f"error: {type(exc).__name__}: {exc}", final=False)))
            self.checkpoints.write(self.state)
            raise
        finally:
            self._open.clear()  # left open in the journal: the next run closes them as interrupted
            self.evaluations.close()
            self._pool_open = False
        stopped = RunStopped(reason=reason, final=final)
        if self.state.jobs:  # aborted by the pool's close; the next resume queues them again
            stopped["interrupted"] = sorted(self.state.jobs)
        self.emit("run.stopped", dict(stopped))
        self.checkpoints.write(self.state)
        return reason

    def close(self) -> None:
        """Close the evaluation pool if no run did (a TUI closed before its agent started)."""
        if self._pool_open:
            self.evaluations.close()
            self._pool_open = False

    def _loop(self, stop: threading.Event, commands: "queue.Queue[Command]") -> tuple[str, bool]:
        while True:
            self._take_commands(commands)
            while self.commands.paused and not stop.is_set():
                self._idle(IDLE_S)  # evaluations in flight still report while paused
                self._take_commands(commands)
            if stop.is_set():
                return self._stop_reason or "stopped by the person", False
            self._take_human_edit()
            exceeded = self.budget.exceeded(self.state, datetime.now(timezone.utc))
            if exceeded:
                return f"budget: {exceeded}", False
            progressed, due = self._step()
            stuck = next((b for b in self.branches if b.finished is not None and not b.final), None)
            if stuck is not None:
                return (f"branch {stuck.number}: " if len(self.branches) > 1 else "") + (stuck.finished or ""), False
            live = [b for b in self.branches if b.finished is None]
            if not live:
                if len(self.branches) == 1:
                    return self.branches[0].finished or "", True
                return "every branch finished: " + "; ".join(f"branch {b.number}: {b.finished}"
                                                             for b in self.branches), True
            # a model reply ends the wait (_offload wakes the pool); a backend's Wait(until=) shortens it
            self._idle(0.0 if progressed else IDLE_S if due is None else min(IDLE_S, max(0.0, due - time.monotonic())))
            if self.checkpoints.due(self.state):
                self.checkpoints.write(self.state)

    def _step(self) -> tuple[bool, float | None]:
        """One step of each live branch: whether any of them did something, and the earliest time a Wait asked to be
        stepped again by (time.monotonic(); None when no branch set one)."""
        progressed, due = False, None
        for branch in self.branches:
            if branch.finished is not None or any(c.branch == branch.number for c in self._open.values()):
                continue  # a branch is asked for its next step once its last call's result is in, as without a pool
            if self.budget.saturated(self.state, self._candidates_in_flight()):
                break  # the evaluations in flight reach --max-iterations: wait for them, start nothing new
            action = branch.backend.next_action(self.state, self.task)
            if isinstance(action, Finish):
                branch.finished, branch.final, progressed = action.reason, action.final, True
                continue
            if isinstance(action, ToolCall):
                self.call_tool(action, branch=branch.number)
                progressed = True
            if isinstance(action, Wait) and action.until is not None:
                due = action.until if due is None else min(due, action.until)
            if branch.memory.kind == "tools":
                # An LLM backend compacts right before a request, when the size of its delta is known.
                self.compact(branch=branch)
        return progressed, due

    def _candidates_in_flight(self) -> int:
        """Attempts with a candidate evaluation queued or running and no result yet."""
        return len({job["attempt"] for job in self.state.jobs.values() if job.get("kind", "candidate") == "candidate"
                    and self.state.attempts[job["attempt"]].verdict is None})

    def _idle(self, timeout: float) -> None:
        """Journal what the pool reported (waiting up to `timeout` for it), close the tool calls it completes."""
        for n in self.evaluations.drain(timeout):
            link_evidence(self.state, n, self.emit)
        for call in [c for c in self._open.values() if c.deferred.ready()]:
            del self._open[call.call_id]
            try:
                outcome = call.deferred.finish()
                result = ToolResult(call_id=call.call_id, tool=call.tool, ok=True, summary=outcome.summary,
                                    data=outcome.data)
            except ToolError as exc:
                result = ToolResult(call_id=call.call_id, tool=call.tool, ok=False, error=str(exc))
            self.emit("tool.result", self._stamped(dict(result), call.ref, call.branch))
        self._show_fleet()

    def _settle(self, stop: threading.Event) -> None:
        """Before a run ends by itself (a finish, a budget): journal the evaluations still in flight, which may make
        a new best; a stop by the person leaves them to the next run."""
        quiet = 0
        while not stop.is_set() and self.state.jobs and quiet < 2:
            seq = self.state.last_seq
            self._idle(IDLE_S)
            # A result the pool holds is journaled by the next drain; a job no slot can take would wait forever.
            quiet = quiet + 1 if self.state.last_seq == seq and not self.evaluations.pool.pending() else 0

    def _show_fleet(self) -> None:
        """Tell the sink what the slots are doing when it changed (phases are not journaled: they change often).

        A job taken or ended, a fault or the queue is sent at once; a change of phase alone at most every
        FLEET_PHASE_S, because every view costs the TUI a repaint of its fleet pane.
        """
        slots = tuple(self.evaluations.pool.slots())
        queued = max(0, self.evaluations.pool.pending() - sum(1 for s in slots if s.state == "busy"))
        jobs = tuple((s.info.slot, s.state, s.job.id if s.job else "", len(s.faults)) for s in slots), queued
        phases = tuple(s.phase for s in slots)
        now = time.monotonic()
        if jobs == self._fleet_shown[0] and (phases == self._fleet_shown[1] or now < self._fleet_shown[2]):
            return
        self._fleet_shown = (jobs, phases, now + FLEET_PHASE_S)
        self._sink.fleet(FleetView(slots, queued))

    def _take_commands(self, commands: "queue.Queue[Command]") -> None:
        for command in self.commands.take(commands):  # the profile command runs the profile tool
            result = self.call_tool(ToolCall("profile", {}))
            if result is not None and not result.get("ok"):
                self._sink.notify(result.get("error", ""), "warning")

    def _take_human_edit(self) -> None:
        """A person's edit of kernel.py becomes a human attempt, evaluated like any other (at step boundaries only,
        so an edit never lands in the middle of a tool call)."""
        try:
            edit = self.working_copy.take(self.state)
        except WorkingCopyError as exc:
            self.emit("error", {"message": str(exc)})
            return
        if edit is None:
            return
        current = self.state.current
        n = self.write_attempt(edit.source, note="edited by hand (kernel.py)", params=edit.params,
                               parent=current.n if current else None, author="human")
        self._sink.notify(f"your edit of kernel.py is attempt {n}; evaluating it")
        self.evaluations.request(n)

    def _recover_in_flight(self) -> None:
        """Close tool calls a crash interrupted (marked aborted, never silently re-run twice), and re-queue the
        evaluations it interrupted (Evaluations.recover)."""
        for call_id, call in sorted(self.state.in_flight.items(), key=lambda kv: kv[1]["seq"]):
            result = ToolResult(call_id=call_id, tool=call["tool"], ok=False, aborted=True,
                                error="interrupted: the process ended before this call finished")
            self.emit("tool.result", self._stamped(dict(result), None, call.get("branch")))
        for attempt in self.state.attempts.values():
            self.attempt_path(attempt.n)
        self.evaluations.recover()

    def _write_start(self) -> None:
        """The kernel the session starts from is attempt 1 (author 'start'), journaled like any other, so a first
        `evaluate` evaluates it. A session journaled before this rule gets it on resume if it has no attempt yet; one
        with attempts keeps its numbering."""
        source = self.backend.seed_source
        if self.state.attempts or not source.strip():
            return
        try:  # the tunables it declares, as for a person's edit, so the tuner does not try them again
            params = read_declared(source).config
        except TunablesError:
            params = {}
        where = f"--start {Path(self.state.start_file).name}" if self.state.start_file else "the task's seed.py"
        self.write_attempt(source, note=where, params=params, parent=None, author="start")

    # -- stopping ------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Stop the run (thread-safe, returns at once) at the next step boundary, within IDLE_S: nothing the loop
        waits for blocks it. The evaluations in flight are aborted when the run closes its pool (their processes
        are killed), named in run.stopped and re-queued by the next resume; run.stopped journals the first reason
        given."""
        with self._stop_lock:
            self._stop_reason = self._stop_reason or reason
            stop = self._stop
        stop.set()

    # -- what backends and tools are given -------------------------------------------------------
    def _context(self, branch: Branch) -> BackendContext:
        many = len(self.branches) > 1

        def emit(type: str, data: dict[str, Any]) -> Event:
            return self.emit(type, {**data, "branch": branch.number} if many else data)

        return BackendContext(emit=emit, notify=self.notify, wait=self.wait, memory=branch.memory,
                              compact=lambda extra_tokens=0, limit=None: self.compact(extra_tokens, limit,
                                                                                      branch=branch),
                              budget=self.budget, context_limit=self.context_limit, offload=self._offload,
                              workers=self.evaluations.candidate_slots(), branch=branch.number,
                              branches=len(self.branches))

    def _offload(self, fn: Callable[[], Any]) -> "Future[Any]":
        """Run fn on a thread of its own (a daemon: a hung model call never keeps the process alive after a stop);
        its end wakes the loop's wait on the pool, so a reply is taken up at once."""
        future: Future[Any] = Future()
        pool = self.evaluations.pool

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the backend through the future
                future.set_exception(exc)
            finally:
                pool.wake()

        threading.Thread(target=run, name="model call", daemon=True).start()
        return future

    def notify(self, text: str, severity: str = "information") -> None:
        """A transient notice for the person (not journaled: the event it is about already is)."""
        self._sink.notify(text, severity)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds` unless the run is stopped; True when it was (backends use it for retry waits)."""
        return self._stop.wait(seconds)

    @property
    def context_limit(self) -> int:
        """The compaction budget: the run's --context-budget, else the backend's default."""
        return self.budget.context_tokens or self.backend.context_tokens

    def compact(self, extra_tokens: int = 0, limit: int | None = None, *, branch: Branch | None = None
                ) -> Event | None:
        """Journal a memory.compacted event when a branch's context would pass its budget; returns it, or None.

        Args:
            extra_tokens: tokens about to be added outside the window (an LLM backend's next request delta).
            limit: a budget lower than the usual one (after the model said the prompt was too long).
            branch: whose window (default: the first branch's).
        """
        branch = branch or self.branches[0]
        overhead = branch.backend.context_overhead(self.state) + extra_tokens
        data = plan_compaction(branch.memory, self.state, limit=limit or self.context_limit, overhead=overhead)
        if data is None:
            return None
        if len(self.branches) > 1:
            data["branch"] = branch.number
        return self.emit("memory.compacted", data)

    def _stamped(self, data: dict[str, Any], ref: str | None, branch: int | None) -> dict[str, Any]:
        """Tool event data with the backend's ref and, in a run of several branches, the branch."""
        if ref:
            data["ref"] = ref
        if branch is not None and len(self.branches) > 1:
            data["branch"] = branch
        return data

    def call_tool(self, action: ToolCall, *, branch: int | None = None) -> ToolResult | None:
        """Journal the intent, run the tool, journal the result; a bad call is a tool error, not a crash.

        Returns:
            The result, or None when the call waits for evaluations (its result is journaled when they are in).
        """
        call_id = f"c{self.state.tool_calls + 1:06d}"
        self.emit("tool.call", self._stamped(dict(ToolCalled(call_id=call_id, tool=action.tool,
                                                             args=_compact_args(action.args))), action.ref, branch))
        tool = TOOLS.get(action.tool)
        self._call_id, self._call_branch = call_id, branch
        try:
            if action.error:
                raise ToolError(action.error)
            if tool is None:
                raise ToolError(f"unknown tool {action.tool!r} (tools: {', '.join(TOOLS)})")
            outcome = tool.run(self.tool_context, check_args(tool, action.args))
            if isinstance(outcome, Deferred):
                self._open[call_id] = OpenCall(call_id, action.tool, action.ref, branch, outcome)
                return None
            result = ToolResult(call_id=call_id, tool=action.tool, ok=True, summary=outcome.summary,
                                data=outcome.data)
        except ToolError as exc:
            result = ToolResult(call_id=call_id, tool=action.tool, ok=False, error=str(exc))
        finally:
            self._call_id, self._call_branch = "", None
        self.emit("tool.result", self._stamped(dict(result), action.ref, branch))
        return result

    def write_attempt(self, source: str, *, note: str, params: dict[str, Any], parent: int | None,
                      author: str = "agent") -> int:
        """Journal a new attempt (with its source), then materialise attempts/NNNN/ and kernel.py from it."""
        n = self.state.next_attempt
        self.emit("attempt.written", dict(AttemptWritten(attempt=n, parent=parent, sha256=sha256_text(source),
                                                         author=author, note=note, params=params, source=source)))
        self.attempt_path(n)
        self.working_copy.write(source)
        return n

    def evaluate(self, n: int, *, force: bool = False) -> Evaluated:
        """Evaluate attempt n and wait for its standing result (scripts; the tools never block on one)."""
        return self.evaluations.evaluate(n, force=force)

    def attempt_path(self, n: int) -> Path:
        """attempts/NNNN/kernel.py, derived from the journal; recreated if a crash left it missing."""
        path = self.files.attempt_dir(n) / "kernel.py"
        if not path.exists():
            attempt = self.state.attempts[n]
            parent = self.state.attempts.get(attempt.parent) if attempt.parent is not None else None
            self.files.write_attempt(n, kernel=attempt.source, parent_kernel=parent.source if parent else None,
                                     parent=attempt.parent)
        return path

    # -- journal -------------------------------------------------------------------------------
    def emit(self, type: str, data: dict[str, Any]) -> Event:
        """Append to the journal (fsync'd), fold into the state and every branch's memory, then tell the sink; in
        that order."""
        event = self.files.journal.append(type, data)  # type: ignore[union-attr]
        record = event.to_dict()
        apply(self.state, record)
        for branch in self.branches:
            branch.memory.apply(record)
        self._sink.emit(event)
        return event
