"""AgentRuntime: the step loop every backend shares; every effect is journaled before anyone reacts to it.

The runtime keeps the loop and the journal writer. Its collaborators each do one job: CommandDesk (commands,
nudges, the inbox, answers to questions), WorkingCopy (the person's edits of kernel.py), Evaluations (the
evaluator, the journal cache, the held-out gate, profiles) and Checkpoints. Tools get a ToolContext and backends a
BackendContext: narrow views, never the runtime itself.

A run stops at a step boundary when its `stop` event is set (the TUI's q), or at once inside an evaluation when
`request_stop` says why (a signal): the evaluation is aborted and its tool call journaled as aborted, and run.stopped
carries the reason given.
"""

from __future__ import annotations

import queue
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.agent.backends.base import Backend, BackendContext, Finish, ToolCall
from workbench.agent.budget import Budget
from workbench.agent.checkpoints import Checkpoints
from workbench.agent.commands import Command, CommandDesk
from workbench.agent.edits import WorkingCopy, WorkingCopyError
from workbench.agent.evaluation import Evaluated, Evaluations, Evaluator, KernelObserver
from workbench.agent.memory import SessionMemory, plan_compaction
from workbench.agent.sink import NullSink, RunSink
from workbench.agent.tools import TOOLS, ToolContext, ToolError, check_args
from workbench.agent.tunables import TunablesError, read_declared
from workbench.evaluator.errors import EvalCancelled
from workbench.journal import Event
from workbench.journal.events import AttemptWritten, RunStarted, RunStopped, ToolCalled, ToolResult
from workbench.session.revisions import sha256_text
from workbench.session.state import SessionState, apply

if TYPE_CHECKING:
    from workbench.session.store import SessionFiles
    from workbench.tasks import Task


def _compact_args(args: Any) -> dict[str, Any]:
    """Tool arguments as journaled in tool.call: kernel sources are journaled once, in attempt.written."""
    if not isinstance(args, dict):
        return {"invalid": repr(args)[:200]}
    out = dict(args)
    if isinstance(out.get("source"), str):
        source = out.pop("source")
        out["source_sha256"], out["source_chars"] = sha256_text(source), len(source)
    return out


class AgentRuntime:
    """Runs one backend against one session until a budget, a finish, a stop or an error.

    The runtime owns the session's journal writer. It is driven from one thread (the TUI's worker or the
    headless main thread) and talks to the outside only through the RunSink and the command queue.
    """

    def __init__(
        self,
        files: "SessionFiles",
        state: SessionState,
        task: "Task",
        backend: Backend,
        *,
        device: str,
        budget: Budget,
        evaluator: Evaluator,
        checkpoint_every: int = 200,
        kernel_observer: KernelObserver | None = None,
    ) -> None:
        self.files = files
        """The session folder (SessionFiles) holding the journal writer."""
        self.state = state
        """Live state: the fold of every event journaled so far."""
        self.task = task
        self.backend = backend
        self.device = device
        self.budget = budget
        self._sink: RunSink = NullSink()
        self._stop = threading.Event()
        self._stop_lock = threading.Lock()
        self._stop_reason = ""
        """Why request_stop() stopped the run ('' for a plain stop event: the person's q)."""
        self._call_id = ""
        self.memory = SessionMemory.load(files, state, backend.memory_kind)
        """The context window every backend shares, rebuilt from the journal and kept in step by emit()."""
        self.commands = CommandDesk(state=state, emit=self.emit, take_inbox=files.take_inbox,
                                    acknowledge=lambda nudge: backend.acknowledge(nudge, self.state, task))
        """Commands, nudges and answers, applied at step boundaries."""
        self.working_copy = WorkingCopy(files.dir / "kernel.py", state)
        """sessions/<id>/kernel.py, for the person to edit in their own editor."""
        self.evaluations = Evaluations(evaluator, task=task, state=state, files=files, emit=self.emit,
                                       attempt_path=self.attempt_path, observer=kernel_observer)
        """Evaluates attempts; owns the evaluator's lifetime."""
        self.checkpoints = Checkpoints(files, self.emit, every=checkpoint_every, last_seq=state.last_seq)
        self.tool_context = ToolContext(state=state, task=task, device=device, seed_source=backend.seed_source,
                                 session_dir=Path(files.dir), emit=self.emit, write_attempt=self.write_attempt,
                                 evaluate=self.evaluate, attempt_path=self.attempt_path,
                                 ask=lambda question: self.commands.ask(question, self._call_id))
        """What every tool runs against."""

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
        resumed = self.state.status not in ("new", "created")
        self.backend.bind(BackendContext(emit=self.emit, notify=self.notify, wait=self.wait, compact=self.compact,
                                         memory=self.memory, budget=self.budget, context_limit=self.context_limit))
        self.emit("run.started", dict(RunStarted(budget=self.budget.to_dict(), resumed=resumed,
                                                 agent=self.backend.name, model=self.backend.model,
                                                 device=self.device)))
        try:
            self._recover_in_flight()
            self._write_start()
            self._confirm_best()
            reason, final = self._loop(stop, commands)
        except BaseException as exc:
            self.emit("error", {"message": f"{type(exc).__name__}: {exc}"})
            self.emit("run.stopped", dict(RunStopped(reason=f"error: {type(exc).__name__}: {exc}", final=False)))
            self.checkpoints.write(self.state)
            raise
        finally:
            self.evaluations.close()
        self.emit("run.stopped", dict(RunStopped(reason=reason, final=final)))
        self.checkpoints.write(self.state)
        return reason

    def _loop(self, stop: threading.Event, commands: "queue.Queue[Command]") -> tuple[str, bool]:
        while True:
            self._take_commands(commands)
            while self.commands.paused and not stop.is_set():
                stop.wait(0.2)
                self._take_commands(commands)
            if stop.is_set():
                return self._stop_reason or "stopped by the person", False
            self._take_human_edit()
            exceeded = self.budget.exceeded(self.state, datetime.now(timezone.utc))
            if exceeded:
                return f"budget: {exceeded}", False
            action = self.backend.next_action(self.state, self.task)
            if isinstance(action, Finish):
                return action.reason, action.final
            if action is not None:
                self.call_tool(action)
            if self.memory.kind == "tools":
                # An LLM backend compacts right before a request, when the size of its delta is known.
                self.compact()
            if self.checkpoints.due(self.state):
                self.checkpoints.write(self.state)

    def _take_commands(self, commands: "queue.Queue[Command]") -> None:
        for command in self.commands.take(commands):  # the profile command runs the profile tool
            result = self.call_tool(ToolCall("profile", {}))
            if not result.get("ok"):
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
        try:
            self.evaluate(n)
        except EvalCancelled:
            self._sink.notify(f"the evaluation of attempt {n} was aborted ({self._stop_reason})", "warning")

    def _recover_in_flight(self) -> None:
        """Close tool calls a crash interrupted: marked aborted, never silently re-run twice."""
        for call_id, call in sorted(self.state.in_flight.items(), key=lambda kv: kv[1]["seq"]):
            self.emit("tool.result", dict(ToolResult(call_id=call_id, tool=call["tool"], ok=False, aborted=True,
                                                     error="interrupted: the process ended before this call "
                                                           "finished")))
        for attempt in self.state.attempts.values():
            self.attempt_path(attempt.n)

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

    def _confirm_best(self) -> None:
        """A best whose held-out check a stop or a kill cut short is checked now, before it counts."""
        try:
            self.evaluations.confirm_best()
        except EvalCancelled:
            pass  # stopped again meanwhile: the loop returns the reason, and the next resume checks it

    # -- stopping ------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Stop the run (thread-safe, returns at once): at the next step boundary, or now when an evaluation runs (it is
        aborted, and its tool call journaled as aborted). run.stopped journals the first reason given."""
        with self._stop_lock:
            self._stop_reason = self._stop_reason or reason
            stop = self._stop
        stop.set()
        self.evaluations.abort(self._stop_reason)

    # -- what backends and tools are given -------------------------------------------------------
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

    def compact(self, extra_tokens: int = 0, limit: int | None = None) -> Event | None:
        """Journal a memory.compacted event when the context would pass its budget; returns it, or None.

        Args:
            extra_tokens: tokens about to be added outside the window (an LLM backend's next request delta).
            limit: a budget lower than the usual one (after the model said the prompt was too long).
        """
        overhead = self.backend.context_overhead(self.state) + extra_tokens
        data = plan_compaction(self.memory, self.state, limit=limit or self.context_limit, overhead=overhead)
        return self.emit("memory.compacted", data) if data is not None else None

    def call_tool(self, action: ToolCall) -> ToolResult:
        """Journal the intent, run the tool, journal the result; a bad call is a tool error, not a crash."""
        call_id = f"c{self.state.tool_calls + 1:06d}"
        ref = {"ref": action.ref} if action.ref else {}
        self.emit("tool.call", dict(ToolCalled(call_id=call_id, tool=action.tool, args=_compact_args(action.args),
                                               **ref)))  # type: ignore[typeddict-item]
        tool = TOOLS.get(action.tool)
        self._call_id = call_id
        try:
            if action.error:
                raise ToolError(action.error)
            if tool is None:
                raise ToolError(f"unknown tool {action.tool!r} (tools: {', '.join(TOOLS)})")
            outcome = tool.run(self.tool_context, check_args(tool, action.args))
            result = ToolResult(call_id=call_id, tool=action.tool, ok=True, summary=outcome.summary,
                                data=outcome.data, **ref)  # type: ignore[typeddict-item]
        except ToolError as exc:
            result = ToolResult(call_id=call_id, tool=action.tool, ok=False, error=str(exc), **ref)  # type: ignore[typeddict-item]
        except EvalCancelled as exc:
            result = ToolResult(call_id=call_id, tool=action.tool, ok=False, aborted=True,  # type: ignore[typeddict-item]
                                error=f"{exc} ({self._stop_reason or 'the run is stopping'})", **ref)
        finally:
            self._call_id = ""
        self.emit("tool.result", dict(result))
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
        """Evaluate attempt n (from the journal when its source was evaluated before, unless force)."""
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
        """Append to the journal (fsync'd), fold into the state, then tell the sink; in that order."""
        event = self.files.journal.append(type, data)  # type: ignore[union-attr]
        record = event.to_dict()
        apply(self.state, record)
        self.memory.apply(record)
        self._sink.emit(event)
        return event
