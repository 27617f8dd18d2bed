"""AgentRuntime: the step loop every backend shares; every effect is journaled before anyone reacts to it."""

from __future__ import annotations

import json
import math
import queue
import threading
import uuid
from concurrent.futures import Future
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from workbench.agent.backends.base import Backend, Finish, ToolCall
from workbench.agent.budget import Budget
from workbench.agent.commands import REVOKE_PREFIX, Command
from workbench.agent.memory import DEFAULT_CONTEXT_TOKENS, SessionMemory, estimate_tokens, plan_compaction
from workbench.agent.prompts import goal_text
from workbench.agent.sink import NullSink, RunSink
from workbench.agent.tunables import TunablesError, read_declared
from workbench.agent.tools import TOOLS, ToolError, check_args, sha256_text
from workbench.journal import Event
from workbench.session.atomic import write_json_atomic, write_text_atomic
from workbench.session.replay import checkpoint_record
from workbench.session.state import SessionState, apply
from workbench.tasks import Task

Evaluator = Callable[..., dict[str, Any]]


HELDOUT_DIR = "heldout"
"""Session subfolder with held-out results: the person may read it, the agent's tools may not."""

PUBLIC_RESULT_KEYS = ("task", "file", "sha256", "device", "verdict", "message", "shapes", "speedup",
                      "timing_comparable", "baseline")
"""The parts of a held-out check that may be journaled where the agent can see them."""


def json_safe(value: Any) -> Any:
    """Replace NaN/inf (not JSON) by their names, so a NaN error figure can be journaled and still read."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _compact_args(args: Any) -> dict[str, Any]:
    """Tool arguments as journaled in tool.call: kernel sources are journaled once, in attempt.written."""
    if not isinstance(args, dict):
        return {"invalid": repr(args)[:200]}
    out = dict(args)
    if isinstance(out.get("source"), str):
        source = out.pop("source")
        out["source_sha256"], out["source_chars"] = sha256_text(source), len(source)
    return out


def _eval_device(device: str) -> str | None:
    """The device an evaluation will run on ("cpu" or "cuda"); None for a name the evaluator will reject."""
    from workbench.devices import DeviceError, resolve_device

    try:
        return resolve_device(device)
    except DeviceError:
        return None


def _ncu_observer(task: Task, path: Path) -> dict[str, Any]:
    """ncu's kernel list for one call of the task's first CUDA shape (workbench.profiler.observer)."""
    from workbench.profiler import observer

    return observer.check(task.name, path, task.shapes["cuda"][0].name)


class AgentRuntime:
    """Runs one backend against one session until a budget, a finish, a stop or an error.

    The runtime owns the session's journal writer. It is driven from one thread (the TUI's worker or the
    headless main thread) and talks to the outside only through the RunSink and the command queue.
    """

    def __init__(
        self,
        files: Any,
        state: SessionState,
        task: Task,
        backend: Backend,
        *,
        device: str,
        budget: Budget,
        evaluator: Evaluator | None = None,
        checkpoint_every: int = 200,
        kernel_observer: Callable[[Task, Path], dict[str, Any]] | None = None,
    ) -> None:
        self.files = files
        """The session folder (SessionFiles) holding the journal writer."""
        self.state = state
        """Live state: the fold of every event journaled so far."""
        self.task = task
        self.backend = backend
        self.device = device
        self.budget = budget
        self.checkpoint_every = checkpoint_every
        self._service = None
        """The evaluation service that lives for the run (default evaluator only): it keeps the reference, the
        baseline and the oracle's outputs, and the next candidate process started while the agent thinks."""
        self._eval_device = _eval_device(device)
        default_evaluator = evaluator is None
        if evaluator is None:
            evaluator = self._service_evaluate
        self._evaluator = evaluator
        self._observer = kernel_observer if kernel_observer is not None else (
            _ncu_observer if default_evaluator and self._eval_device == "cuda" else None)
        """Lists a new best's kernels from outside its process (ncu on CUDA); None skips that check."""
        self._sink: RunSink = NullSink()
        self._paused = False
        self._last_checkpoint_seq = state.last_seq
        self._working_sha = state.current.sha256 if state.current else ""
        """sha256 of what the runtime last wrote to the session's kernel.py (the person's working copy)."""
        self._stop = threading.Event()
        self._asks: dict[str, tuple[str, Future[str]]] = {}
        self._call_id = ""
        self.memory = SessionMemory.load(files, state, getattr(backend, "memory_kind", "tools"))
        """The context window both backends share, rebuilt from the journal and kept in step by emit()."""

    # -- the loop ------------------------------------------------------------------------------
    def run(self, stop: threading.Event, commands: "queue.Queue[Command] | None" = None, sink: RunSink | None = None) -> str:
        """Run until something ends the run; returns the stop reason (also journaled as run.stopped)."""
        self._sink = sink or NullSink()
        self._stop = stop
        commands = commands if commands is not None else queue.Queue()
        resumed = self.state.status not in ("new", "created")
        bind = getattr(self.backend, "bind", None)
        if bind is not None:
            bind(self)
        self.emit(
            "run.started",
            {"budget": self.budget.to_dict(), "resumed": resumed, "agent": self.backend.name,
             "model": self.backend.model, "device": self.device},
        )
        self._prestart()
        try:
            self._recover_in_flight()
            reason, final = self._loop(stop, commands)
        except BaseException as exc:
            self.emit("error", {"message": f"{type(exc).__name__}: {exc}"})
            self.emit("run.stopped", {"reason": f"error: {type(exc).__name__}: {exc}", "final": False})
            self.checkpoint()
            raise
        finally:
            if self._service is not None:
                self._service.close()
                self._service = None
        self.emit("run.stopped", {"reason": reason, "final": final})
        self.checkpoint()
        return reason

    def _loop(self, stop: threading.Event, commands: "queue.Queue[Command]") -> tuple[str, bool]:
        while True:
            self._take_commands(commands)
            while self._paused and not stop.is_set():
                stop.wait(0.2)
                self._take_commands(commands)
            if stop.is_set():
                return "stopped by the person", False
            self._take_human_edit()
            exceeded = self.budget.exceeded(self.state, datetime.now(timezone.utc))
            if exceeded:
                return f"budget: {exceeded}", False
            action = self.backend.next_action(self.state, self.task)
            if isinstance(action, Finish):
                return action.reason, True
            if action is not None:
                self.call_tool(action)
            if self.memory.kind == "tools":
                # An LLM backend compacts right before a request, when the size of its delta is known.
                self.maybe_compact()
            if self.state.last_seq - self._last_checkpoint_seq >= self.checkpoint_every:
                self.checkpoint()

    def _take_commands(self, commands: "queue.Queue[Command]") -> None:
        """Apply queued commands and inbox nudges: the only place a nudge or pause takes effect."""
        while True:
            try:
                command = commands.get_nowait()
            except queue.Empty:
                break
            if command.kind == "nudge":
                self._nudge(command.text, command.persistent, "tui")
            elif command.kind == "pause" and not self._paused:
                self._paused = True
                self.emit("run.paused", {})
            elif command.kind == "resume" and self._paused:
                self._paused = False
                self.emit("run.resumed", {})
            elif command.kind == "revoke":
                self._revoke(command.text)
            elif command.kind == "profile":
                outcome = self.call_tool(ToolCall("profile", {}))
                if not outcome["ok"]:
                    self._sink.notify(outcome["error"], "warning")
        self._take_answers()
        # The inbox file is deleted only after its nudge is journaled: a crash may deliver it twice, never lose it.
        taken = self.files.take_inbox(
            record=lambda item: self._nudge(str(item.get("text", "")), bool(item.get("persistent")), "inbox")
        )
        for item in taken:
            if "error" in item:
                self.emit("error", {"message": f"inbox: {item['error']}"})

    def _nudge(self, text: str, persistent: bool, origin: str) -> None:
        if not text.strip():
            return
        if text.strip().startswith(REVOKE_PREFIX.strip()):
            self._revoke(text.strip()[len(REVOKE_PREFIX.strip()):].strip())
            return
        nudge = {"id": uuid.uuid4().hex[:8], "text": text.strip(), "persistent": persistent, "origin": origin}
        self.emit("nudge.received", nudge)
        note = self.backend.acknowledge(nudge, self.state, self.task)
        self.emit("nudge.acked", {"id": nudge["id"], "note": note})

    def _revoke(self, nudge_id: str) -> None:
        """Withdraw a persistent nudge (journaled as nudge.acked, revoked: true); an unknown id is an error event."""
        persistent = [n for n in self.state.active_nudges() if n["persistent"]]
        matches = [n for n in persistent if nudge_id and n["id"].startswith(nudge_id)]
        if len(matches) != 1:
            known = ", ".join(n["id"] for n in persistent) or "none"
            problem = "matches several" if matches else "matches no"
            self.emit("error", {"message": f"revoke {nudge_id!r}: {problem} persistent nudge in force ({known})"})
            return
        self.emit("nudge.acked", {"id": matches[0]["id"], "revoked": True, "note": "revoked by the person"})

    def ask(self, question: str) -> bool:
        """Put a question to the person without waiting; returns whether anyone can answer it.

        The answer, when the sink's future resolves, is journaled as a one-off nudge at a later step boundary.
        """
        future = self._sink.ask(question)
        if future.done():
            return False
        self._asks[self._call_id or uuid.uuid4().hex[:8]] = (question, future)
        return True

    def _take_answers(self) -> None:
        for key, (question, future) in list(self._asks.items()):
            if not future.done():
                continue
            del self._asks[key]
            if future.cancelled():
                self._nudge(f"The person declined to answer your question: {question}", False, "answer")
                continue
            try:
                answer = future.result()
            except Exception as exc:  # the UI failed to answer; say so rather than lose the question
                answer = f"(no answer: {type(exc).__name__})"
            self._nudge(f"Answer to your question \"{question}\": {answer}", False, "answer")

    def notify(self, text: str, severity: str = "information") -> None:
        """A transient notice for the person (not journaled: the event it is about already is)."""
        self._sink.notify(text, severity)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds` unless the run is stopped; True when it was (backends use it for retry waits)."""
        return self._stop.wait(seconds)

    def _prestart(self) -> None:
        """Start the evaluation service now, while the backend prepares its first step."""
        if self._evaluator != self._service_evaluate or self._eval_device is None:
            return  # an injected evaluator, or an unknown device: the evaluation itself reports it, in its words
        if self._service is None:
            from workbench.evaluator import EvaluationService

            try:
                self._service = EvaluationService(self.task, self._eval_device)
            except OSError:
                pass  # no processes to spare now: the first evaluation tries again

    def _service_evaluate(self, task: Task, path: Path, device: str, heldout: bool = False) -> dict[str, Any]:
        """The default evaluator: this run's evaluation service (started on first use when not yet)."""
        if self._service is None:
            from workbench.evaluator import EvaluationService

            self._service = EvaluationService(task, device)
        return dict(self._service.evaluate(path, heldout=heldout))

    # -- memory --------------------------------------------------------------------------------
    def maybe_compact(self, extra_tokens: int = 0) -> Event | None:
        """Journal a memory.compacted event when the context would pass its budget; returns it, or None.

        Args:
            extra_tokens: tokens about to be added outside the window (an LLM backend's next request delta).
        """
        limit = self.budget.context_tokens or getattr(self.backend, "context_tokens", DEFAULT_CONTEXT_TOKENS)
        overhead_of = getattr(self.backend, "context_overhead", None)
        overhead = overhead_of(self.state) if overhead_of else estimate_tokens(goal_text(self.state.goal))
        data = plan_compaction(self.memory, self.state, limit=limit, overhead=overhead + extra_tokens)
        return self.emit("memory.compacted", data) if data is not None else None

    def _recover_in_flight(self) -> None:
        """Close tool calls a crash interrupted: marked aborted, never silently re-run twice."""
        for call_id, call in sorted(self.state.in_flight.items(), key=lambda kv: kv[1]["seq"]):
            self.emit(
                "tool.result",
                {"call_id": call_id, "tool": call["tool"], "ok": False, "aborted": True,
                 "error": "interrupted: the process ended before this call finished"},
            )
        for attempt in self.state.attempts.values():
            self._ensure_attempt_files(attempt.n)

    # -- tools ---------------------------------------------------------------------------------
    def call_tool(self, action: ToolCall) -> dict[str, Any]:
        """Journal the intent, run the tool, journal the result; a bad call is a tool error, not a crash."""
        call_id = f"c{self.state.tool_calls + 1:06d}"
        ref = {"ref": action.ref} if action.ref else {}
        self.emit("tool.call", {"call_id": call_id, "tool": action.tool, "args": _compact_args(action.args), **ref})
        tool = TOOLS.get(action.tool)
        self._call_id = call_id
        try:
            if action.error:
                raise ToolError(action.error)
            if tool is None:
                raise ToolError(f"unknown tool {action.tool!r} (tools: {', '.join(TOOLS)})")
            outcome = tool.run(self, check_args(tool, action.args))
        except ToolError as exc:
            self.emit("tool.result", {"call_id": call_id, "tool": action.tool, "ok": False, "error": str(exc), **ref})
            return {"ok": False, "error": str(exc)}
        finally:
            self._call_id = ""
        data = {k: v for k, v in outcome.data.items() if k not in ("result", "source", "task")}
        self.emit("tool.result", {"call_id": call_id, "tool": action.tool, "ok": True, "summary": outcome.summary,
                                  "data": data, **ref})
        return {"ok": True, "summary": outcome.summary, **outcome.data}

    def write_attempt(self, source: str, *, note: str, params: dict[str, Any], parent: int | None,
                      author: str = "agent") -> int:
        """Journal a new attempt (with its source), then materialise attempts/NNNN/ from it."""
        n = self.state.next_attempt
        self.emit(
            "attempt.written",
            {"attempt": n, "parent": parent, "sha256": sha256_text(source), "author": author, "note": note,
             "params": params, "source": source},
        )
        self._ensure_attempt_files(n)
        self._write_working_copy(source)
        return n

    @property
    def working_copy(self) -> Path:
        """sessions/<id>/kernel.py: the current kernel, for the person to edit in their own editor."""
        return self.files.dir / "kernel.py"

    def _write_working_copy(self, source: str) -> None:
        write_text_atomic(self.working_copy, source)  # an editor never reads half a kernel
        self._working_sha = sha256_text(source)

    def _take_human_edit(self) -> None:
        """A person's edit of the working copy becomes a human attempt, evaluated like any other.

        Checked at step boundaries only, so an edit never lands in the middle of a tool call; an unchanged file
        (or one equal to the current attempt) is not an edit.
        """
        current = self.state.current
        try:
            text = self.working_copy.read_text(encoding="utf-8")
        except FileNotFoundError:
            if current is not None:
                self._write_working_copy(current.source)
            return
        except (OSError, UnicodeDecodeError) as exc:
            self.emit("error", {"message": f"kernel.py: unreadable ({exc})"})
            return
        sha = sha256_text(text)
        if sha == self._working_sha or (current is not None and sha == current.sha256) or not text.strip():
            self._working_sha = sha
            return
        try:  # record the tunables the edit declares, so the tuner does not re-try them
            params = read_declared(text).config
        except TunablesError:
            params = {}
        n = self.write_attempt(text, note="edited by hand (kernel.py)", params=params,
                               parent=current.n if current else None, author="human")
        self._sink.notify(f"your edit of kernel.py is attempt {n}; evaluating it")
        self.evaluate_attempt(n)

    def _ensure_attempt_files(self, n: int) -> Path:
        """attempts/NNNN/kernel.py is derived from the journal; recreate it if a crash left it missing."""
        path = self.files.attempt_dir(n) / "kernel.py"
        if not path.exists():
            attempt = self.state.attempts[n]
            parent = self.state.attempts.get(attempt.parent) if attempt.parent is not None else None
            self.files.write_attempt(n, kernel=attempt.source, parent_kernel=parent.source if parent else None,
                                     parent=attempt.parent)
        return path

    def evaluate_attempt(self, n: int) -> dict[str, Any]:
        """Evaluate attempt n in a fresh process; journal the result as eval.finished."""
        path = self._ensure_attempt_files(n)
        best_before = self.state.best
        result = json_safe(self._evaluator(self.task, path, device=self.device))
        self.files.write_attempt_result(n, result)
        self.emit("eval.finished", {"attempt": n, "result": result})
        if isinstance(result.get("profile"), dict):
            self._emit_profile(n, result["profile"], best_before)
        if result.get("verdict") == "ok" and self.state.best == n and best_before != n:
            result = self._check_heldout(n, path, result)
        return result

    def _check_heldout(self, n: int, path: Path, result: dict[str, Any]) -> dict[str, Any]:
        """A new best must also pass the held-out shapes before it stands; the agent never sees their details.

        The journal gets the attempt's public result (its own timings), with the verdict turned into a failure
        when the held-out run fails, and a summary (shape count, passed, held-out speedup).

        The full result goes to heldout/NNNN.json (outside what the agent's tools may read). A failure is an
        eval.finished that demotes the attempt.
        """
        check = json_safe(self._evaluator(self.task, path, device=self.device, heldout=True))
        hidden = check.get("heldout") or []
        folder = self.files.dir / HELDOUT_DIR
        folder.mkdir(exist_ok=True)
        write_json_atomic(folder / f"{n:04d}.json", check)
        # The gate is pass/fail: the attempt keeps the timings of its own evaluation, not a second noisy sample.
        public = {k: result[k] for k in PUBLIC_RESULT_KEYS if k in result}
        public_ok = all(s.get("correct") is not False for s in check.get("shapes", []))
        passed = check.get("verdict") == "ok" and all(s.get("correct") for s in hidden)
        if not passed:
            public["verdict"] = check.get("verdict") if check.get("verdict") != "ok" else "incorrect"
            public["message"] = (f"failed on held-out shapes (details hidden from the agent, in "
                                 f"{HELDOUT_DIR}/{n:04d}.json)") if public_ok else check.get("message", "")
        observed: dict[str, Any] | None = None
        if passed and self._observer is not None:
            observed = self._observe(path)
            if observed.get("problems"):
                passed = False
                public["verdict"] = "forbidden"
                public["message"] = (f"{path.name}: {observed['problems'][0]} "
                                     "(seen by ncu, outside the candidate process)")
        summary = {"shapes": len(hidden), "passed": passed, "speedup": check.get("heldout_speedup")}
        data: dict[str, Any] = {"attempt": n, "check": "heldout", "result": public, "heldout": summary}
        if observed is not None:
            data["observed"] = observed
        self.emit("eval.finished", data)
        return public

    def _observe(self, path: Path) -> dict[str, Any]:
        """The kernel list of the new best from outside its process; an observer that cannot run is noted, and the
        best stands on the evaluator's own provenance check."""
        try:
            return self._observer(self.task, path)  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - ncu missing or not permitted must not stop a run
            return {"error": f"{type(exc).__name__}: {exc}"[:300]}

    def _emit_profile(self, n: int, profile: dict[str, Any], best: int | None) -> None:
        """Journal an evaluation's kernel table and roofline, with deltas against the best attempt's profile."""
        data: dict[str, Any] = {"attempt": n, "source": "evaluation", **profile}
        if best is not None and best != n:
            try:
                previous = json.loads((self.files.attempt_dir(best) / "result.json").read_text()).get("profile")
            except (OSError, ValueError):
                previous = None
            if isinstance(previous, dict):
                from workbench.profiler import diff

                data["against"] = best
                data["deltas"] = diff(previous, profile)
        self.emit("profile.finished", data)

    def attempt_path(self, n: int) -> Path:
        """The kernel file of attempt n (recreated from the journal if missing)."""
        return self._ensure_attempt_files(n)

    def backend_seed_source(self) -> str:
        """The kernel the session started from."""
        return getattr(self.backend, "seed_source", "")

    # -- journal -------------------------------------------------------------------------------
    def emit(self, type: str, data: dict[str, Any]) -> Event:
        """Append to the journal (fsync'd), fold into the state, then tell the sink; in that order."""
        event = self.files.journal.append(type, data)
        record = event.to_dict()
        apply(self.state, record)
        self.memory.apply(record)
        self._sink.emit(event)
        return event

    def checkpoint(self) -> None:
        """Write session.toml as a checkpoint of the state at the current seq; journal that it was written."""
        self.files.write_checkpoint(checkpoint_record(self.state), seq=self.state.last_seq)
        self.emit("checkpoint.written", {"seq": self.state.last_seq})
        self._last_checkpoint_seq = self.state.last_seq
