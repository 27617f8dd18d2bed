"""RunSink: the one channel from the runtime to whoever watches it (TUI bridge, headless printer, tests)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

from workbench.journal import Event


class RunSink(Protocol):
    """Receives what the runtime reports; implementations must return at once (never block the agent)."""

    def emit(self, event: Event) -> None:
        """An event that is already appended and fsync'd to the journal."""

    def notify(self, text: str, severity: str = "information") -> None:
        """A transient message for the person (not journaled)."""

    def ask(self, question: str) -> Future[str]:
        """Ask the person something; the runtime polls the future in short slices so it still sees `stop`."""


class NullSink:
    """A sink that drops everything: for tests and batch jobs that only want the journal."""

    def emit(self, event: Event) -> None:
        """Drop the event."""

    def notify(self, text: str, severity: str = "information") -> None:
        """Drop the message."""

    def ask(self, question: str) -> Future[str]:
        """Answer nothing: a future that is already cancelled."""
        future: Future[str] = Future()
        future.cancel()
        return future


class RecordingSink(NullSink):
    """Keeps every emitted event and notice, in order; tests assert on them."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.notices: list[str] = []

    def emit(self, event: Event) -> None:
        """Record the event."""
        self.events.append(event)

    def notify(self, text: str, severity: str = "information") -> None:
        """Record the notice."""
        self.notices.append(text)
