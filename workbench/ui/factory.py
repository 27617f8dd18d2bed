"""make_app: the one way to build the workbench TUI, shared by the CLI and the snapshot tests."""

from __future__ import annotations

import copy
from pathlib import Path

from workbench.config import Settings
from workbench.session.state import SessionState
from workbench.ui.app import WorkbenchApp
from workbench.ui.launch import AgentRunner, Inbox, Launch
from workbench.ui.themes import SHIPPED_THEMES_DIR, load_themes


def make_app(
    settings: Settings,
    *,
    state: SessionState,
    runtime: AgentRunner | None = None,
    follow_path: Path | None = None,
    inbox: Inbox | None = None,
    review_root: Path | None = None,
    review_id: str | None = None,
) -> WorkbenchApp:
    """Build the app for one session.

    Args:
        settings: user preferences; tests pass a fixed theme, watchers off, a frozen clock, no cursor blink.
        state: the session's state at start (checkpoint plus replayed tail). The app folds events into its
            own deep copy, so passing `runtime.state` is safe: the runtime keeps mutating the original.
        runtime: the agent to run in a thread worker on mount ('live' mode); stopped cleanly by q.
        follow_path: the events.jsonl of a session another process runs ('attached' mode, read-only).
        inbox: with follow_path, where nudges go: a callable taking (text, persistent).
        review_root: a sessions folder to browse read-only ('review' mode: the session list, then one session).
        review_id: with review_root, the session (id or unique prefix) to open first.

    Returns:
        The app; call `.run()` and read the stop reason from its return value.

    Raises:
        ValueError: both runtime and follow_path given (one writer per session: a TUI either runs the agent or
            follows it), an inbox without follow_path, review together with a runtime or a followed journal, or a
            review_id without review_root.
    """
    launch = Launch(runtime, follow_path, inbox, review_root, review_id)
    theme_dirs = [SHIPPED_THEMES_DIR] + ([settings.themes_dir] if settings.themes_dir is not None else [])
    # Theme files are read here, before the event loop starts, so the first frame has the right colours.
    themes = load_themes(theme_dirs)
    return WorkbenchApp(settings, copy.deepcopy(state), themes, launch, theme_dirs=theme_dirs)
