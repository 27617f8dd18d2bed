"""Main-thread CPU of the live screen's work, in process and headless (no terminal, no load): what a key costs from
the Key event to the end of its frame, and what the flush tick's frame costs, against a bare Textual app's key.

Run: PYTHONPATH=. python benchmarks/tui_key_cpu.py [--presses 300]

Thread CPU, so it is not the key-to-paint (benchmarks/tui_responsiveness.py --tmux measures that in a real terminal
under load), but it is the work that decides how long a frame holds the main thread and how often a busy box
preempts it, and it moves little from run to run. The live screen is the softmax fixture's (FakeRuntime, no new
events); the key is `f`, posted as the input thread posts it, and its frame's share in the event log's render_lines
is timed too; the tick's frame repaints the log and the status clock.
The two table panes are timed as the tick redraws them: the evaluation table showing a new evaluation of every shape
(two results taking turns), and the fleet pane showing the fleet fixture's four slots with new phases. Medians and
quartiles of ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from copy import deepcopy
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from textual import events  # noqa: E402
from textual.geometry import Region  # noqa: E402
from textual.screen import Screen  # noqa: E402
from textual.strip import Strip  # noqa: E402

from tests.snapshot_apps.fake_runtime import FIXTURES, FakeRuntime, load_events  # noqa: E402
from tests.snapshot_apps.live_app import make_live_app, settle, utc_clock  # noqa: E402
from workbench.agent.sink import FleetView  # noqa: E402
from workbench.fleet.api import EvalJob, SlotInfo, SlotStatus  # noqa: E402
from workbench.session.state import SessionState  # noqa: E402
from workbench.ui.widgets.eval_table import EvalTable, latest_evaluated  # noqa: E402
from workbench.ui.widgets.event_log import EventLog  # noqa: E402
from workbench.ui.widgets.fleet_panel import FleetPanel  # noqa: E402
from tui_responsiveness import BareApp  # noqa: E402


class Frames:
    """Screen._on_timer_update wrapped: `mark()` arms it, and the next frame's end is timed from the mark. The event
    log's render_lines is timed too, from the mark to that frame's end (`log_samples`)."""

    def __init__(self) -> None:
        self.armed = False
        self.start = 0.0
        self.samples: list[float] = []
        self.log_cpu = 0.0
        self.log_samples: list[float] = []
        update, render_lines = Screen._on_timer_update, EventLog.render_lines

        def timed(screen: Screen[Any]) -> None:
            update(screen)
            if self.armed:
                self.armed = False
                self.samples.append((time.thread_time() - self.start) * 1000)
                self.log_samples.append(self.log_cpu * 1000)

        def log_timed(log: EventLog, crop: Region) -> list[Strip]:
            start = time.thread_time()
            try:
                return render_lines(log, crop)
            finally:
                self.log_cpu += time.thread_time() - start

        Screen._on_timer_update = timed  # type: ignore[method-assign]
        EventLog.render_lines = log_timed  # type: ignore[method-assign]

    def mark(self) -> None:
        self.armed, self.start, self.log_cpu = True, time.thread_time(), 0.0

    async def each(self, presses: int, act: Callable[[], object]) -> list[float]:
        """ms of main-thread CPU from `act()` to the end of the frame it causes, `presses` times."""
        self.samples, self.log_samples = [], []
        for _ in range(presses):
            await asyncio.sleep(0.02)
            self.mark()
            act()
            while self.armed:
                await asyncio.sleep(0.0005)
        return self.samples


def evaluations(state: SessionState) -> list[SessionState]:
    """Two copies of `state` whose latest evaluation has other times in every shape (and another seq)."""
    out = []
    for turn in (1, 2):
        copy = deepcopy(state)
        attempt = latest_evaluated(copy)
        assert attempt is not None and attempt.eval_seq is not None
        attempt.eval_seq += turn
        scale = 1 + turn / 100
        attempt.shapes = [{**shape, "ms": shape["ms"] * scale, "speedup": shape["speedup"] / scale}
                          for shape in attempt.shapes]
        out.append(copy)
    return out


def fleet_views() -> list[FleetView]:
    """Two views of four busy H200 slots, in other phases."""
    path = Path("attempts/kernel.py")
    return [FleetView(tuple(
        SlotStatus(SlotInfo(f"cuda:{i}", "cuda", gpu=str(i), gpu_name="NVIDIA H200"), "busy",
                   EvalJob(f"j{i}", 4 + i, path, ""), f"{phase} S{i + 1}", 3) for i in range(4)), 1)
        for phase in ("timing", "correctness")]


async def measure(presses: int) -> dict[str, list[float]]:
    frames = Frames()
    out: dict[str, list[float]] = {}
    app, runtime = make_live_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, runtime)
        screen = app.screen
        out["workbench: f, Key event to the end of its frame"] = await frames.each(
            presses, lambda: app.post_message(events.Key("f", "f")))
        out["workbench: f, the event log's render_lines in that frame"] = frames.log_samples
        out["workbench: the flush tick's frame (log and status clock)"] = await frames.each(
            presses, lambda: (screen.query_one("EventLog").refresh(), screen.query_one("#clock").refresh()))
        table, states = screen.query_one(EvalTable), evaluations(app.state)
        out["workbench: the evaluation table with a new evaluation, to the end of its frame"] = await frames.each(
            presses, lambda: table.show(states[len(frames.samples) % 2]))
    app, runtime = make_live_app(FakeRuntime(load_events(FIXTURES / "fleet_run.jsonl")))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, runtime)
        panel, views = app.screen.query_one(FleetPanel), fleet_views()
        out["workbench: the fleet pane with new phases, to the end of its frame"] = await frames.each(
            presses, lambda: panel.show(app.state, views[len(frames.samples) % 2]))
    bare = BareApp()
    async with bare.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        out["bare app: f, Key event to the end of its frame"] = await frames.each(
            presses, lambda: bare.post_message(events.Key("f", "f")))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presses", type=int, default=300)
    args = parser.parse_args()
    with utc_clock():
        results = asyncio.run(measure(args.presses))
    print("| main-thread CPU, headless | median | p25 | p75 |")
    print("|---|---|---|---|")
    for name, samples in results.items():
        q1, q2, q3 = statistics.quantiles(samples, n=4)
        print(f"| {name} | {q2:.2f} ms | {q1:.2f} ms | {q3:.2f} ms |")


if __name__ == "__main__":
    main()
