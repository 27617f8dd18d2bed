"""Launch: what one TUI is for (drive a run, follow a journal another process writes, review past sessions, or
show one session), checked once, where it is made."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from workbench.agent.commands import Command
from workbench.agent.sink import RunSink
from workbench.session.state import SessionState

Inbox = Callable[[str, bool], object]
"""Drops a nudge (text, persistent) into a session's inbox; used when this TUI only follows the journal."""


class AgentRunner(Protocol):
    """What the app needs from the runtime (workbench.agent.runtime.AgentRuntime satisfies it)."""

    state: SessionState

    def run(self, stop: threading.Event, commands: "queue.Queue[Command]", sink: RunSink) -> str:
        """Run until a budget, a finish, an error or `stop`; return the stop reason."""
        ...

    def request_stop(self, reason: str) -> None:
        """Stop for `reason` (a signal): thread-safe, returns at once; an evaluation in progress is aborted."""
        ...


@dataclass(frozen=True)
class Launch:
    """The one thing a TUI does; the combinations that make no sense are refused here.

    Raises:
        ValueError: both runtime and follow_path (one writer per session: a TUI either runs the agent or follows
            it), an inbox without follow_path, review together with a runtime or a followed journal, or a
            review_id without review_root.
    """

    runtime: AgentRunner | None = None
    """The agent this TUI drives ('live'), stopped cleanly by q."""
    follow_path: Path | None = None
    """The events.jsonl of a session another process runs ('attached', read-only)."""
    inbox: Inbox | None = None
    """With follow_path, where nudges go."""
    review_root: Path | None = None
    """A sessions folder to browse read-only ('review': the session list, then one session)."""
    review_id: str | None = None
    """With review_root, the session (id or unique prefix) to open first."""

    def __post_init__(self) -> None:
        if self.runtime is not None and self.follow_path is not None:
            raise ValueError("make_app: pass runtime (run the agent) or follow_path (attach), not both")
        if self.inbox is not None and self.follow_path is None:
            raise ValueError("make_app: inbox is for attach mode; a running agent takes nudges from the command "
                             "queue")
        if self.review_root is not None and (self.runtime is not None or self.follow_path is not None):
            raise ValueError("make_app: review browses finished sessions; it takes no runtime or follow_path")
        if self.review_id is not None and self.review_root is None:
            raise ValueError("make_app: review_id needs review_root (the sessions folder it lives in)")

    @property
    def mode(self) -> str:
        """'live' (this TUI runs the agent), 'attached' (it follows a journal), 'review' or 'view' (neither)."""
        if self.runtime is not None:
            return "live"
        if self.review_root is not None:
            return "review"
        return "attached" if self.follow_path is not None else "view"
