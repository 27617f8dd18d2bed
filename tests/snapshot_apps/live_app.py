"""The live screen after replaying the softmax fixture: `python -m tests.snapshot_apps.live_app` shows it."""

from __future__ import annotations

import asyncio
import os
import time
from contextlib import contextmanager
from typing import Any, Iterator

import pytest
from textual.pilot import Pilot

from tests.snapshot_apps.fake_runtime import FakeRuntime
from workbench.config import Settings
from workbench.ui.app import WorkbenchApp
from workbench.ui.factory import make_app
from workbench.ui.screens.live import LiveScreen
from workbench.ui.screens.review import ReviewScreen

FROZEN_CLOCK = "2026-11-29T22:14:02.000Z"
"""24 s after the fixture's last event: the status clock reads 0:01:02 in every snapshot."""


def ui_settings(**overrides: Any) -> Settings:
    """The deterministic configuration every UI test uses: fixed theme, frozen clock, no blink, no watchers."""
    values: dict[str, Any] = dict(
        theme="workbench-dark",
        watch_themes=False,
        frozen_clock=FROZEN_CLOCK,
        cursor_blink=False,
        log_max_lines=5000,
    )
    values.update(overrides)
    return Settings(**values)




@contextmanager
def utc_clock() -> Iterator[None]:
    """Log lines show local time: pin the zone to UTC so snapshots match on every machine, then restore it."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


@pytest.fixture(autouse=True)
def pinned_utc() -> Iterator[None]:
    """utc_clock around every test of a module that imports this fixture (importing it is what enables it)."""
    with utc_clock():
        yield


def make_live_app(runtime: FakeRuntime | None = None, **settings: Any) -> tuple[WorkbenchApp, FakeRuntime]:
    """The app exactly as `workbench run` builds it, with a FakeRuntime in place of the agent."""
    runtime = runtime or FakeRuntime()
    return make_app(ui_settings(**settings), state=runtime.state, runtime=runtime), runtime


async def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    """Yield to the app until predicate() holds; fail loudly instead of hanging."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {getattr(predicate, '__name__', predicate)}")
        await asyncio.sleep(0.01)


async def settle(pilot: Pilot[Any], runtime: FakeRuntime) -> None:
    """Wait for the replay, let the app handle every posted event, then flush the live screen once."""
    await wait_for(runtime.replayed.is_set)
    app = pilot.app
    assert isinstance(app, WorkbenchApp)
    last = runtime.events[-1].seq
    await wait_for(lambda: app.state.last_seq >= last)
    screen = app.screen
    if isinstance(screen, LiveScreen):
        screen.flush()
    await pilot.pause()


if __name__ == "__main__":
    with utc_clock():
        make_live_app(frozen_clock=None)[0].run()


def live_screen(app: Any) -> LiveScreen:
    """The app's current screen, which the test expects to be the live one."""
    screen = app.screen
    assert isinstance(screen, LiveScreen), f"expected the live screen, got {screen!r}"
    return screen


async def review_loaded(pilot: Pilot[Any]) -> ReviewScreen:
    """Wait until the review screen has read its session and added every timeline row."""
    app = pilot.app

    def ready() -> bool:
        screen = app.screen
        return isinstance(screen, ReviewScreen) and screen.history is not None and \
            screen.rows_added == len(screen.history.order)

    await wait_for(ready)
    await pilot.pause()
    screen = app.screen
    assert isinstance(screen, ReviewScreen)
    return screen


def capture_notes(app: Any) -> list[str]:
    """Every notification the app shows from now on, still shown as usual."""
    notes: list[str] = []
    original = app.notify

    def notify(message: str, **kwargs: Any) -> None:
        notes.append(message)
        original(message, **kwargs)

    app.notify = notify
    return notes
