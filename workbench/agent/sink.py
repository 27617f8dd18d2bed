"""RunSink: the one channel from the runtime to whoever watches it (TUI bridge, headless printer, tests)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from workbench.fleet.api import SlotStatus
from workbench.journal import Event


@dataclass(frozen=True)
class FleetView:
    """The run's evaluation slots as they are now: what each is doing (its attempt and phase) and the queue."""

    slots: tuple[SlotStatus, ...]
    """A snapshot of every slot (EvaluationPool.slots()), in the pool's order."""
    queued: int
    """Jobs waiting for a slot."""


class RunSink(Protocol):
    """Receives what the runtime reports; implementations must return at once (never block the agent)."""

    def emit(self, event: Event) -> None:
        """An event that is already appended and fsync'd to the journal."""

    def notify(self, text: str, severity: str = "information") -> None:
        """A transient message for the person (not journaled)."""

    def ask(self, question: str) -> Future[str]:
        """Ask the person something; the runtime polls the future in short slices so it still sees `stop`."""

    def fleet(self, view: FleetView) -> None:
        """The slots changed (a job taken, a phase, a fault): sent when it changes, not journaled (the journal has
        eval.started, eval.finished and fleet.slot; phases change too often to be events)."""


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

    def fleet(self, view: FleetView) -> None:
        """Drop the view."""


class RecordingSink(NullSink):
    """Keeps every emitted event and notice, in order; tests assert on them."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.notices: list[str] = []
        self.fleets: list[FleetView] = []

    def emit(self, event: Event) -> None:
        """Record the event."""
        self.events.append(event)

    def notify(self, text: str, severity: str = "information") -> None:
        """Record the notice."""
        self.notices.append(text)

    def fleet(self, view: FleetView) -> None:
        """Record the view."""
        self.fleets.append(view)
