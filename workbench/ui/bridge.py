"""UiBridge: the RunSink the runtime talks to in the TUI; it only posts messages, so it never blocks the agent."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable

from textual.message import Message

from workbench.ui.messages import FleetChanged, JournalEvent, Notice, Question

if TYPE_CHECKING:
    from workbench.agent.sink import FleetView
    from workbench.journal import Event


class UiBridge:
    """Implements workbench.agent.sink.RunSink on top of a thread-safe `post_message`.

    It holds the callable, not the App, so the runtime cannot reach widgets even by accident.
    """

    def __init__(self, post_message: Callable[[Message], bool]) -> None:
        self._post = post_message
        """App.post_message: thread-safe and returns at once."""

    def emit(self, event: "Event") -> None:
        """Forward an event the runtime has already journaled."""
        self._post(JournalEvent(event))

    def notify(self, text: str, severity: str = "information") -> None:
        """Forward a transient notice."""
        self._post(Notice(text, severity))

    def fleet(self, view: "FleetView") -> None:
        """Forward the slots' state (collapsed with older views still queued)."""
        self._post(FleetChanged(view))

    def ask(self, question: str) -> "Future[str]":
        """Post the question and hand back the future the UI will resolve (or cancel, if the person declines)."""
        future: Future[str] = Future()
        self._post(Question(question, future))
        return future
