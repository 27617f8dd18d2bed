"""SessionView: what the screens read of the app. They change nothing through it; commands go up as messages.

WorkbenchApp implements it. The screens name this protocol instead of the app class, so the app may import its
screens without the screens importing the app back.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from workbench.agent.sink import FleetView
from workbench.config import Settings
from workbench.session.state import SessionState
from workbench.ui.launch import Launch


class SessionView(Protocol):
    """The app as its screens see it (read only)."""

    settings: Settings
    state: SessionState
    """The UI's own fold of the session's events."""
    recent: deque[dict[str, Any]]
    """The newest events (what the event list is drawn from)."""
    launch: Launch
    """What the TUI does (the review folder and the session to open first, in review mode)."""
    fleet: FleetView | None
    """The runtime's latest view of its evaluation slots (a TUI that runs the agent), else None."""
    fleet_seen: int
    """Fleet views received so far: the live screen redraws the fleet pane when it moves."""

    @property
    def mode(self) -> str:
        """'live', 'attached', 'review' or 'view'."""
        ...

    @property
    def run_state(self) -> str:
        """What the status pill says ('running', 'pausing', 'stopping', ...)."""
        ...

    @property
    def can_nudge(self) -> bool:
        """Whether a nudge can reach the agent (the command queue, or a followed session's inbox)."""
        ...

    @property
    def can_command(self) -> bool:
        """Whether pause, resume and profile can reach the agent."""
        ...

    def take_pending(self) -> list[dict[str, Any]]:
        """The events received since the last flush."""
        ...

    def current_profile(self) -> dict[str, Any] | None:
        """Everything profiled for the attempt profiled last."""
        ...

    def best_profile(self) -> dict[str, Any] | None:
        """The best attempt's profile, when it is not the one on show."""
        ...
