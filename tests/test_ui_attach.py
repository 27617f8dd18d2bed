"""Attach mode: the TUI follows a journal another process writes, read-only, with nudges through the inbox."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.snapshot_apps.fake_runtime import SOFTMAX_RUN
from tests.snapshot_apps.live_app import ui_settings, wait_for
from tests.snapshot_apps.live_app import pinned_utc  # noqa: F401 - autouse: log times in UTC
from workbench.journal import read_events
from workbench.session.state import fold
from workbench.ui.factory import make_app
from workbench.ui.screens.live import LiveScreen
from workbench.ui.screens.nudge import NudgeScreen
from workbench.ui.widgets.event_log import EventLog
from workbench.ui.widgets.kernel_view import KernelView
from workbench.ui.widgets.status_bar import StatusBar

SIZE = (120, 40)



def test_make_app_refuses_contradictory_modes(tmp_path: Path) -> None:
    from tests.snapshot_apps.fake_runtime import FakeRuntime

    with pytest.raises(ValueError, match="not both"):
        make_app(ui_settings(), state=fold([]), runtime=FakeRuntime([]), follow_path=tmp_path / "events.jsonl")
    with pytest.raises(ValueError, match="inbox"):
        make_app(ui_settings(), state=fold([]), inbox=lambda text, persistent: None)


def test_make_app_keeps_its_own_copy_of_the_state() -> None:
    state = fold(e.to_dict() for e in read_events(SOFTMAX_RUN))
    app = make_app(ui_settings(), state=state)
    assert app.state is not state and app.state.last_seq == state.last_seq
    state.tool_calls += 100
    assert app.state.tool_calls == state.tool_calls - 100


async def test_attached_tui_follows_appends_and_nudges_through_the_inbox(tmp_path: Path) -> None:
    lines = SOFTMAX_RUN.read_bytes().splitlines(keepends=True)
    journal = tmp_path / "events.jsonl"
    journal.write_bytes(b"".join(lines[:20]))
    state = fold(e.to_dict() for e in read_events(journal))
    dropped: list[tuple[str, bool]] = []
    dropped_event = threading.Event()

    def inbox(text: str, persistent: bool) -> None:
        dropped.append((text, persistent))
        dropped_event.set()

    app = make_app(ui_settings(), state=state, follow_path=journal, inbox=inbox)
    assert app.mode == "attached"
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        assert isinstance(screen, LiveScreen)
        with journal.open("ab") as f:  # the headless writer appends the rest of the run
            f.write(b"".join(lines[20:]))
        await wait_for(lambda: app.state.last_seq == 32)
        screen.flush()
        assert screen.query_one(EventLog).line_count == 12, "only events after the starting state are new"
        kernel = screen.query_one(KernelView)
        assert kernel.shown is not None and kernel.shown[0] == 5
        assert "attached, read-only" in str(screen.query_one(StatusBar).query_one("#summary").render())

        await pilot.press("p", "r")
        assert app.commands.empty(), "an attached TUI cannot pause or profile another process's agent"

        await pilot.press("n")
        assert isinstance(app.screen, NudgeScreen)
        await pilot.press(*"hi", "enter")
        await wait_for(dropped_event.is_set)
        assert dropped == [("hi", False)]

        await pilot.press("q")
        await wait_for(lambda: not app.is_running)
    assert app.return_value == "detached"


async def test_attached_without_inbox_cannot_nudge(tmp_path: Path) -> None:
    journal = tmp_path / "events.jsonl"
    journal.write_bytes(SOFTMAX_RUN.read_bytes())
    state = fold(e.to_dict() for e in read_events(journal))
    app = make_app(ui_settings(), state=state, follow_path=journal)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("n")
        await pilot.pause()
        assert isinstance(app.screen, LiveScreen), "no nudge dialog for a session nobody can deliver to"
        assert app.screen.check_action("nudge", ()) is None, "the binding is shown greyed out"
        # A nudge that reaches the app some other way (a message, the command palette) goes nowhere either.
        app.screen.post_message(LiveScreen.NudgeSent("hi", False))
        await pilot.pause()
        assert app.commands.empty() and not (tmp_path / "inbox").exists()
