"""Runtime-to-UI messages: plain dataclasses posted from worker threads to the App, which owns all state."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from workbench.agent.sink import FleetView
    from workbench.journal import Event


@dataclass
class JournalEvent(Message):
    """One event, already appended to the journal; the App folds it into its SessionState."""

    event: "Event"
    """The journal record (anything with seq, type and to_dict()). Never collapsed into a newer one (Message's
    default): every event must reach the state and the log."""


@dataclass
class RunFinished(Message):
    """The agent (or journal-follow) thread returned: the moment a clean stop has completed."""

    reason: str
    """The stop reason the runtime returned (also journaled in run.stopped), or 'error'."""
    error: str = ""
    """The exception as one line when the thread ended by raising; '' otherwise."""


@dataclass
class StopRequested(Message):
    """A signal (SIGTERM, SIGHUP) asked the run to stop; the runtime was told already, the app exits once it has."""

    reason: str
    """What run.stopped will journal ('stopped by signal SIGTERM')."""
    hung_up: bool = False
    """The terminal is gone (SIGHUP): nobody sees the screen, so the app exits at once (run() waits for the run)."""


@dataclass
class Notice(Message):
    """A transient line for the person (not journaled): shown with notify()."""

    text: str
    severity: str = "information"
    """'information', 'warning' or 'error', as App.notify takes it."""


@dataclass
class Question(Message):
    """The runtime asks the person something; the handler resolves `future` with the answer."""

    text: str
    future: "Future[str]"
    """Resolved on the UI thread; the runtime polls it in short slices so it still sees stop."""


@dataclass
class FleetChanged(Message):
    """The run's evaluation slots as they are now (phases, the queue): not journaled, so only the newest matters."""

    view: "FleetView"

    def can_replace(self, message: Message) -> bool:
        """A newer view replaces an older one still queued."""
        return isinstance(message, FleetChanged)
