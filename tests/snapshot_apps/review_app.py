"""Review mode over the fixture sessions folder: `python -m tests.snapshot_apps.review_app [ID]` shows it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from tests.snapshot_apps.live_app import ui_settings, utc_clock
from workbench.session.state import SessionState
from workbench.ui.app import WorkbenchApp
from workbench.ui.factory import make_app

REPO = Path(__file__).resolve().parents[2]
"""The repository root: snapshot tests run from it, so paths shown on screen are the same on every machine."""

SESSIONS = Path("tests/fixtures/ui/sessions")
"""The fixture sessions folder, relative to REPO (make_sessions.py writes it)."""

LIVE_ID = "20261129-221300-softmax-7f3a"
"""The live fixture, cut off mid-run (status running)."""

LONG_ID = "20261128-090000-softmax-c0de"
"""A finished 40-attempt session with failures, a human edit, nudges, a compaction and profiles."""


def copy_sessions(target: Path) -> Path:
    """A private copy of the fixture sessions (export writes report.md into a session folder)."""
    shutil.copytree(REPO / SESSIONS, target)
    return target


def make_review_app(root: Path = SESSIONS, review_id: str | None = None, **settings: Any) -> WorkbenchApp:
    """The app exactly as `workbench review [ID]` builds it."""
    return make_app(ui_settings(**settings), state=SessionState(), review_root=root, review_id=review_id)


if __name__ == "__main__":
    with utc_clock():
        make_review_app(REPO / SESSIONS, sys.argv[1] if len(sys.argv) > 1 else None).run()
