"""How the live screen's frames are drawn: SparseCompositor against Textual's own (the same partial updates write
the same bytes to the terminal, rendering fewer widgets), and the frame cap the front end sets."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from typing import Any

from textual._compositor import Compositor
from textual.geometry import Region
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
        render_lines = Widget.render_lines

        def counted(self: Widget, crop: Region) -> Any:
            rendered.append(type(self).__name__)
            return render_lines(self, crop)

        screen._compositor._dirty_regions.add(screen.query_one(EventLog).region)
        Widget.render_lines = counted  # type: ignore[method-assign]
        try:
            screen._compositor.render_partial_update()
        finally:
            Widget.render_lines = render_lines  # type: ignore[method-assign]
        # The log, its scrollbars and their corner, and the screen behind: no pane above it, nor the footer.
        assert "EventLog" in rendered
        assert set(rendered) <= {"EventLog", "LiveScreen", "ScrollBar", "ScrollBarCorner"}, rendered


def test_the_front_end_raises_the_frame_cap_unless_the_environment_sets_one() -> None:
    probe = "import workbench.ui.factory, textual.constants as c; print(c.MAX_FPS)"
    env = {k: v for k, v in os.environ.items() if k != "TEXTUAL_FPS"}

    def cap(**extra: str) -> str:
        return subprocess.run([sys.executable, "-c", probe], env={**env, **extra}, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert cap() == "240"
    assert cap(TEXTUAL_FPS="30") == "30"
