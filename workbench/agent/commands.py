"""Commands the person sends to a running agent, and the desk that applies them at step boundaries.

Commands arrive from the TUI's queue and from the session inbox (`workbench nudge`, an attached TUI); answers to
the agent's questions arrive as resolved futures. All of them take effect only at a step boundary, never in the
middle of a tool call, and each is journaled before anything reacts to it.
"""

from __future__ import annotations

import queue
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal

from workbench.agent.sink import NullSink, RunSink
from workbench.journal.events import NudgeAcked, NudgeReceived

if TYPE_CHECKING:
    from workbench.journal import Event
    from workbench.session.state import SessionState

CommandKind = Literal["nudge", "pause", "resume", "revoke", "profile"]

REVOKE_PREFIX = "/revoke "
"""A nudge whose text starts with this revokes the persistent nudge named after it (the inbox carries only text)."""


@dataclass(frozen=True)
class Command:
    """One instruction from the UI (or the inbox); never applied mid-tool-call.

    For ``revoke``, ``text`` is the id of the persistent nudge to withdraw (a unique prefix is enough).
    """

    kind: CommandKind
    text: str = ""
    persistent: bool = False


class CommandDesk:
    """Applies commands, inbox nudges and answers; keeps whether the run is paused and which questions are open."""

    def __init__(self, *, state: "SessionState", emit: Callable[[str, dict[str, Any]], "Event"],
                 acknowledge: Callable[[NudgeReceived], str],
                 take_inbox: Callable[[Callable[[dict[str, Any]], Any]], list[dict[str, Any]]]) -> None:
        self.state = state
        """The live session state (read: the nudges in force)."""
        self._emit = emit
        self._acknowledge = acknowledge
        """The backend's word on a nudge (journaled in nudge.acked)."""
        self._take_inbox = take_inbox
        """SessionFiles.take_inbox: removes each inbox file only after its nudge is journaled."""
        self.sink: RunSink = NullSink()
        """Where questions go; set for each run."""
        self.paused = False
        """A pause command was applied and no resume since."""
        self._asks: dict[str, tuple[str, Future[str]]] = {}

    def take(self, commands: "queue.Queue[Command]") -> list[Command]:
        """Apply what is queued, then answers, then the inbox; returns the commands that run a tool (profile)."""
        tools: list[Command] = []
        while True:
            try:
                command = commands.get_nowait()
            except queue.Empty:
                break
            if command.kind == "nudge":
                self.nudge(command.text, command.persistent, "tui")
            elif command.kind == "pause" and not self.paused:
                self.paused = True
                self._emit("run.paused", {})
            elif command.kind == "resume" and self.paused:
                self.paused = False
                self._emit("run.resumed", {})
            elif command.kind == "revoke":
                self.revoke(command.text)
            elif command.kind == "profile":
                tools.append(command)
        self._take_answers()
        # The inbox file is deleted only after its nudge is journaled: a crash may deliver it twice, never lose it.
        taken = self._take_inbox(
            lambda item: self.nudge(str(item.get("text", "")), bool(item.get("persistent")), "inbox"))
        for item in taken:
            if "error" in item:
                self._emit("error", {"message": f"inbox: {item['error']}"})
        return tools

    def nudge(self, text: str, persistent: bool, origin: str) -> None:
        """Journal a nudge (or a revoke written as one) and the backend's acknowledgement of it."""
        if not text.strip():
            return
        if text.strip().startswith(REVOKE_PREFIX.strip()):
            self.revoke(text.strip()[len(REVOKE_PREFIX.strip()):].strip())
            return
        nudge = NudgeReceived(id=uuid.uuid4().hex[:8], text=text.strip(), persistent=persistent,
                              origin=origin)  # type: ignore[typeddict-item]
        self._emit("nudge.received", dict(nudge))
        self._emit("nudge.acked", dict(NudgeAcked(id=nudge["id"], note=self._acknowledge(nudge))))

    def revoke(self, nudge_id: str) -> None:
        """Withdraw a persistent nudge (journaled as nudge.acked, revoked: true); an unknown id is an error event."""
        persistent = [n for n in self.state.active_nudges() if n["persistent"]]
        matches = [n for n in persistent if nudge_id and n["id"].startswith(nudge_id)]
        if len(matches) != 1:
            known = ", ".join(n["id"] for n in persistent) or "none"
            problem = "matches several" if matches else "matches no"
            self._emit("error", {"message": f"revoke {nudge_id!r}: {problem} persistent nudge in force ({known})"})
            return
        self._emit("nudge.acked", dict(NudgeAcked(id=matches[0]["id"], revoked=True, note="revoked by the person")))

    def ask(self, question: str, key: str) -> bool:
        """Put a question to the person without waiting; returns whether anyone can answer it.

        The answer, when the sink's future resolves, is journaled as a one-off nudge at a later step boundary.
        """
        future = self.sink.ask(question)
        if future.done():
            return False
        self._asks[key or uuid.uuid4().hex[:8]] = (question, future)
        return True

    def _take_answers(self) -> None:
        for key, (question, future) in list(self._asks.items()):
            if not future.done():
                continue
            del self._asks[key]
            if future.cancelled():
                self.nudge(f"The person declined to answer your question: {question}", False, "answer")
                continue
            try:
                answer = future.result()
            except Exception as exc:  # the UI failed to answer; say so rather than lose the question
                answer = f"(no answer: {type(exc).__name__})"
            self.nudge(f"Answer to your question \"{question}\": {answer}", False, "answer")
