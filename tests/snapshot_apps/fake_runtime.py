"""FakeRuntime replays a fixture journal through sink.emit and answers commands as the runtime does; FloodRuntime
keeps emitting after it, for load tests."""

from __future__ import annotations

import queue
import threading
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from workbench.agent.commands import Command
from workbench.agent.sink import RunSink
from workbench.journal import Event, read_events
from workbench.session.state import SessionState, parse_ts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ui"
SOFTMAX_RUN = FIXTURES / "softmax_run.jsonl"
"""A 32-event CUDA softmax session, stopped mid-run with one evaluate call in flight (make_softmax_run.py)."""


def load_events(path: Path = SOFTMAX_RUN) -> list[Event]:
    """The fixture's events, read (and hash-checked) by the journal's own reader."""
    return list(read_events(path))


class FakeRuntime:
    """Stands in for AgentRuntime: same run() signature, no evaluator, no disk.

    It emits the fixture events in order, then (with hold=True) waits for commands and for `stop` the way the
    real step loop does: a nudge is journaled as nudge.received + nudge.acked, pause and resume as run.paused
    and run.resumed, and stop ends the run with run.stopped.
    """

    def __init__(
        self,
        events: list[Event] | None = None,
        *,
        hold: bool = True,
        fail: BaseException | None = None,
        release: threading.Event | None = None,
        serve_commands: bool = True,
    ) -> None:
        self.events = load_events() if events is None else events
        """What run() replays."""
        self.state = SessionState()
        """The state at start: a fresh session (the factory copies it)."""
        self.hold = hold
        """After the replay, keep running until stop (True) or return at once (False)."""
        self.fail = fail
        """Raised after the replay, to exercise the worker-error path."""
        self.release = release
        """When given, a seen stop waits for it before returning: lets a test look at the 'stopping' UI."""
        self.serve_commands = serve_commands
        """Drain and answer queued commands; off, they stay in the queue for a test to inspect."""
        self.replayed = threading.Event()
        """Set once every fixture event has been emitted."""
        self.saw_stop = threading.Event()
        """Set when the run noticed `stop` (what q must cause)."""
        self.finished = threading.Event()
        """Set as run() returns."""
        self.commands_seen: list[Command] = []
        self.stop_reason = ""
        """What request_stop() was given (a signal's stop); '' for q."""
        self._stop = threading.Event()
        self._last: Event | None = None

    def request_stop(self, reason: str) -> None:
        """As AgentRuntime.request_stop: stop with this reason (the first one given wins)."""
        self.stop_reason = self.stop_reason or reason
        self._stop.set()

    def _emit(self, sink: RunSink, kind: str, data: dict[str, Any]) -> Event:
        last = self._last
        assert last is not None, "emit before the replay"
        ts = (parse_ts(last.ts) + timedelta(seconds=1)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        event = Event(last.seq + 1, ts, kind, data, "")
        self._last = event
        sink.emit(event)
        return event

    def run(self, stop: threading.Event, commands: "queue.Queue[Command]", sink: RunSink) -> str:
        """Replay, then serve commands until stop; returns the stop reason like AgentRuntime.run."""
        if self._stop.is_set():
            stop.set()
        self._stop = stop
        try:
            for event in self.events:
                if stop.is_set():
                    break
                self._last = replace(event)
                sink.emit(event)
            self.replayed.set()
            if self.fail is not None:
                raise self.fail
            while self.hold and not stop.wait(0.01):
                if self.serve_commands:
                    self._take(commands, sink)
            if stop.is_set():
                self.saw_stop.set()
                if self.release is not None:
                    self.release.wait(10)
                reason = self.stop_reason or "stopped by the person"
            else:
                reason = "replay finished"
            self._emit(sink, "run.stopped", {"reason": reason, "final": False})
            return reason
        finally:
            self.finished.set()

    def _take(self, commands: "queue.Queue[Command]", sink: RunSink) -> None:
        while True:
            try:
                command = commands.get_nowait()
            except queue.Empty:
                return
            self.commands_seen.append(command)
            if command.kind == "nudge":
                nudge_id = f"n{len(self.commands_seen):07d}"
                self._emit(sink, "nudge.received",
                           {"id": nudge_id, "text": command.text, "persistent": command.persistent})
                self._emit(sink, "nudge.acked", {"id": nudge_id, "note": "noted"})
            elif command.kind == "pause":
                self._emit(sink, "run.paused", {})
            elif command.kind == "resume":
                self._emit(sink, "run.resumed", {})


class FloodRuntime(FakeRuntime):
    """A busy agent: replays the fixture, then emits synthetic events at `rate` per second until stopped.

    Every 20 events make one step with a new attempt (written, evaluated, ledger updated) among tool calls and model
    traffic, so the kernel, evaluation, metrics and log panes all have work on each flush tick.
    """

    def __init__(self, rate: float = 100.0, **kwargs: Any) -> None:
        super().__init__(hold=True, **kwargs)
        self.rate = rate
        """Synthetic events per second after the replay."""
        self.emitted = 0
        """Synthetic events emitted so far."""

    def _synthetic(self, i: int, attempt: int) -> tuple[str, dict[str, Any]]:
        step = i % 20
        call = f"f{i // 2:07d}"
        if step == 0:
            source = self.events[27].data["source"].replace("num_warps=16", f"num_warps={4 + attempt % 13}")
            return "attempt.written", {"attempt": attempt, "parent": attempt - 1, "sha256": f"{attempt:064x}",
                                       "author": "agent", "note": f"flood attempt {attempt}", "params": {},
                                       "source": source}
        if step == 1:
            speed = 1.0 + (attempt % 17) / 20
            shapes = [{"name": f"S{k}", "correct": True, "rel_err": 2e-7, "ms": 0.03 * k / speed,
                       "baseline_ms": 0.03 * k, "speedup": speed, "floor_ms": 0.01 * k} for k in (1, 2, 3)]
            return "eval.finished", {"attempt": attempt, "result": {"verdict": "ok", "message": "", "speedup": speed,
                                                                    "timing_comparable": True, "shapes": shapes}}
        if step == 2:
            return "ledger.updated", {"ledger": [{"id": "S1", "strategy": "flood", "status": "trying",
                                                  "attempts": [attempt]}]}
        if step % 4 == 3:
            return "llm.response", {"ok": True, "input_tokens": 9000, "output_tokens": 400, "cost_usd": 0.033}
        if step % 2:
            return "tool.result", {"call_id": call, "tool": "read_file", "ok": True, "summary": "reference.py: 900 chars"}
        return "tool.call", {"call_id": call, "tool": "read_file", "args": {"path": "reference.py"}}

    def run(self, stop: threading.Event, commands: "queue.Queue[Command]", sink: RunSink) -> str:
        """Replay, then flood at `rate` (paced by the monotonic clock) while serving commands, until stop."""
        import time

        try:
            for event in self.events:
                self._last = replace(event)
                sink.emit(event)
            self.replayed.set()
            attempt = max(e.data["attempt"] for e in self.events if e.type == "attempt.written")
            due = time.monotonic()
            while not stop.is_set():
                self._take(commands, sink)
                if self.emitted % 20 == 0:
                    attempt += 1
                self._emit(sink, *self._synthetic(self.emitted, attempt))
                self.emitted += 1
                due += 1 / self.rate
                delay = due - time.monotonic()
                if delay > 0:
                    stop.wait(delay)
            self.saw_stop.set()
            self._emit(sink, "run.stopped", {"reason": "stopped by the person", "final": False})
            return "stopped by the person"
        finally:
            self.finished.set()
