"""How the live screen's frames are drawn: SparseCompositor against Textual's own (the same partial updates write
the same bytes to the terminal, rendering fewer widgets), and the frame cap the front end sets."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from typing import Any

import pytest
from textual import constants
from textual._compositor import Compositor
from textual._styles_cache import StylesCache
from textual.geometry import Offset, Region
from textual.selection import Selection
from textual.strip import Strip
from textual.widget import Widget

from tests.snapshot_apps.fake_runtime import FloodRuntime
from tests.snapshot_apps.live_app import live_screen, make_live_app, settle
from tests.snapshot_apps.live_app import pinned_utc  # noqa: F401 - autouse: log times in UTC
from workbench.ui.compositor import SparseCompositor
from workbench.ui.widgets.event_log import EventLog
from workbench.ui.widgets.status_bar import StatusBar

SIZE = (120, 40)


def written(compositor: Compositor, regions: list[Region], app: Any, *, textual: bool) -> str:
    """What a partial update of `regions` writes to the terminal, by SparseCompositor or by Textual's own method."""
    compositor._dirty_regions.update(regions)
    update = Compositor.render_partial_update(compositor) if textual else compositor.render_partial_update()
    return "" if update is None else update.render_segments(app.console)


def widget_regions(screen: Any) -> list[Region]:
    return [region.intersection(clip) for region, clip in screen._compositor.visible_widgets.values()]


async def test_partial_updates_write_what_textual_writes() -> None:
    app, runtime = make_live_app(FloodRuntime(rate=200.0))
    rng = random.Random(3)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        screen = live_screen(app)
        compositor = screen._compositor
        assert isinstance(compositor, SparseCompositor)
        screen_region = Region(0, 0, *SIZE)
        log, status = screen.query_one(EventLog).region, screen.query_one(StatusBar).region
        cases = [[log], [status, log], [screen_region], [Region(0, 0, 1, 1)], [Region(119, 39, 1, 1)]]
        for _ in range(20):  # whole widgets, several at once, and arbitrary rectangles across widgets
            pieces = rng.sample(widget_regions(screen), rng.randint(1, 4))
            x, y = rng.randrange(SIZE[0]), rng.randrange(SIZE[1])
            pieces.append(Region(x, y, rng.randint(1, SIZE[0] - x), rng.randint(1, SIZE[1] - y)))
            cases.append(pieces)
        for regions in cases:
            screen.flush()  # the flood moves the log on between cases; within one, nothing runs between the two
            await pilot.pause()
            ours = written(compositor, regions, app, textual=False)
            assert ours and ours == written(compositor, regions, app, textual=True), regions


async def test_a_log_frame_renders_only_the_log_and_what_overlaps_it() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        screen = live_screen(app)
        rendered: list[str] = []
        originals = {cls: cls.render_lines for cls in (Widget, EventLog)}  # the log draws most rows itself

        def counting(cls: type[Widget]) -> Any:
            def counted(self: Widget, crop: Region) -> Any:
                rendered.append(type(self).__name__)
                return originals[cls](self, crop)
            return counted

        screen._compositor._dirty_regions.add(screen.query_one(EventLog).region)
        for cls in originals:
            cls.render_lines = counting(cls)  # type: ignore[method-assign]
        try:
            screen._compositor.render_partial_update()
        finally:
            for cls, original in originals.items():
                cls.render_lines = original  # type: ignore[method-assign]
        # The log, its scrollbars and their corner, and the screen behind: no pane above it, nor the footer.
        assert "EventLog" in rendered
        assert set(rendered) <= {"EventLog", "LiveScreen", "ScrollBar", "ScrollBarCorner"}, rendered


def textual_rows(log: EventLog, crop: Region) -> list[Strip]:
    """The log's rows in `crop` drawn by Textual's own path from nothing kept (every line highlighted again, every row
    through StylesCache)."""
    log.notify_style_update()
    log.refresh()
    return Widget.render_lines(log, crop)


def styled_rows(log: EventLog, crops: list[Region]) -> tuple[list[list[Strip]], list[list[Strip]], int]:
    """The log's own rows for each crop twice: first with what it kept from the state before (the first crop learns
    the frame and draws the borders if the styles changed), then with what it keeps now; and how many times the second
    pass went to Textual's path."""
    first = [log.render_lines(crop) for crop in crops]
    calls = [0]
    render_widget = StylesCache.render_widget

    def counted(self: StylesCache, widget: Widget, crop: Region) -> list[Strip]:
        calls[0] += 1
        return render_widget(self, widget, crop)

    StylesCache.render_widget = counted  # type: ignore[method-assign]
    try:
        return first, [log.render_lines(crop) for crop in crops], calls[0]
    finally:
        StylesCache.render_widget = render_widget  # type: ignore[method-assign]


@pytest.mark.parametrize("environment", ["plain", "NO_COLOR", "TEXTUAL_FILTERS=dim"])
async def test_the_log_draws_the_rows_textual_draws_without_its_styles_pipeline(
        environment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log puts its content rows together from kept strips (issue 17 item 6: the pipeline was most of a key's
    frame). Each state a person can reach must give Textual's rows segment for segment (text, colour, background,
    meta: the selection offsets), for whole, partial and sideways crops, under every line filter the app can have;
    selected text takes Textual's path."""
    if environment == "NO_COLOR":
        monkeypatch.setenv("NO_COLOR", "1")
    elif environment == "TEXTUAL_FILTERS=dim":
        monkeypatch.setattr(constants, "FILTERS", "dim")
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        screen = live_screen(app)
        log = screen.query_one(EventLog)
        assert len(app.get_line_filters()) == {"plain": 1, "NO_COLOR": 2, "TEXTUAL_FILTERS=dim": 2}[environment]

        async def check(state: str, *, pipeline: bool = False) -> None:
            await pilot.pause()
            width, height = log.region.size
            crops = [Region(0, 0, width, height), Region(0, 1, width, height - 2), Region(0, 3, width, 2),
                     Region(5, 0, 40, height), Region(width - 3, height - 1, 3, 1), Region(0, 0, width, 1)]
            first, ours, through_pipeline = styled_rows(log, crops)
            for crop, before, rows in zip(crops, first, ours):
                theirs = [list(row) for row in textual_rows(log, crop)]
                assert [list(row) for row in before] == theirs, (state, crop, "from what was kept before")
                assert [list(row) for row in rows] == theirs, (state, crop)
                assert [row.cell_length for row in rows] == [crop.width] * crop.height, (state, crop)
            assert (through_pipeline > 0) == pipeline, (state, through_pipeline)
            for crop in crops:  # keep this state's rows for the next state's first pass
                log.render_lines(crop)

        await check("the tail, all events")
        await pilot.press("f")
        await check("filtered")
        log.scroll_to(x=0, y=3, animate=False, immediate=True)
        await check("scrolled up")
        log.scroll_to(x=17, y=3, animate=False, immediate=True)
        await check("scrolled sideways")
        log.focus()
        await check("focused (tinted background, lit border)")
        screen.selections = {log: Selection(Offset(4, 2), Offset(30, 4))}
        await check("text selected", pipeline=True)
        screen.selections = {}
        await check("selection cleared")
        # Textual's DimFilter fails on the ANSI theme's default colours in any widget (TypeError in dim_color).
        ansi = [] if environment.startswith("TEXTUAL_FILTERS") else ["workbench-ansi"]
        for theme in ["workbench-light", *ansi, "workbench-dark"]:
            app.theme = theme
            await check(theme)
        log.write_events([{"seq": 999, "ts": 0.0, "type": "error", "data": {"message": "x" * 300}}])
        await check("a new event, wider than the rest, followed at the tail")
        await pilot.resize_terminal(90, 30)
        await check("resized")
        screen.focus_next()
        await check("blurred")
        log.styles.background = "#203040"
        await check("a background set in code, nothing else changed")
        log.styles.color = "#80ff80"
        await check("a text colour set in code")
        log.styles.border_subtitle_color = "#ff8000"
        await check("a subtitle colour set in code")
        log.styles.padding = (0, 1)
        await check("padding (Textual's path)", pipeline=True)


def test_the_front_end_raises_the_frame_cap_unless_the_environment_sets_one() -> None:
    probe = "import workbench.ui.factory, textual.constants as c; print(c.MAX_FPS)"
    env = {k: v for k, v in os.environ.items() if k != "TEXTUAL_FPS"}

    def cap(**extra: str) -> str:
        return subprocess.run([sys.executable, "-c", probe], env={**env, **extra}, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert cap() == "240"
    assert cap(TEXTUAL_FPS="30") == "30"
