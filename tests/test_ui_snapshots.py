"""Snapshot tests at 120x40 with a fixed theme and a frozen clock: the live screen in several states, its modals,
review mode, and a bad theme."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable

from tests.snapshot_apps.fake_runtime import FakeRuntime
from tests.snapshot_apps.live_app import live_screen, make_live_app, review_loaded, settle, wait_for
from tests.snapshot_apps.live_app import pinned_utc  # noqa: F401 - autouse: log times in UTC
from tests.snapshot_apps.review_app import LONG_ID, REPO, SESSIONS, make_review_app
from workbench.journal import Event
from workbench.ui.messages import JournalEvent
from workbench.ui.screens.sessions import SessionsScreen

SIZE = (120, 40)



def _replayed(runtime: FakeRuntime) -> Any:
    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot, runtime)

    return run_before


@pytest.mark.parametrize("theme", ["workbench-dark", "workbench-light", "workbench-ansi"])
def test_live_screen_after_replay(snap_compare: Any, theme: str) -> None:
    app, runtime = make_live_app(theme=theme)
    assert snap_compare(app, terminal_size=SIZE, run_before=_replayed(runtime))


def test_nudge_dialog_over_live_screen(snap_compare: Any) -> None:
    app, runtime = make_live_app()

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot, runtime)
        await pilot.press("n")
        await pilot.press(*"use one pass when cols <= BLOCK_SIZE")
        await pilot.press("f2")

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_help_lists_bindings(snap_compare: Any) -> None:
    app, runtime = make_live_app()

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot, runtime)
        await pilot.press("f1")

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_paused_run_after_nudge(snap_compare: Any) -> None:
    """A nudge and a pause round-trip through the runtime and show in the goal panel, log and status pill."""
    app, runtime = make_live_app()

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot, runtime)
        await pilot.press("n", *"prefer num_warps=8 on S2", "enter")
        await pilot.press("p")
        await wait_for(lambda: app.state.status == "paused")
        live_screen(app).flush()
        app.clear_notifications()
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_live_screen_diff_vs_parent(snap_compare: Any) -> None:
    """`d` once: the kernel pane shows the highlighted diff from attempt 4 (the parent) to attempt 5."""
    app, runtime = make_live_app()

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot, runtime)
        await pilot.press("d")

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_live_screen_with_a_profile_against_the_best(snap_compare: Any) -> None:
    """Two profiles arrive (the best's, then the current attempt's): the pane opens with deltas against the best."""
    app, runtime = make_live_app()

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot, runtime)
        last = runtime.events[-1]
        for offset, (n, scale) in enumerate(((4, 1.0), (5, 0.9)), start=1):
            data = {"attempt": n, "summary": "memory-bound: DRAM 61% of peak",
                    "kernels": [{"name": "_softmax_kernel", "calls": 3, "total_ms": 0.0741 * scale,
                                 "mean_ms": 0.0247 * scale, "share": 0.94},
                                {"name": "elementwise_kernel", "calls": 3, "total_ms": 0.0048, "mean_ms": 0.0016,
                                 "share": 0.06}],
                    "ncu": {"dram__throughput.avg.pct_of_peak_sustained_elapsed": 61.0 * scale,
                            "sm__throughput.avg.pct_of_peak_sustained_elapsed": 30.5,
                            "launch__registers_per_thread": 32}}
            app.post_message(JournalEvent(Event(last.seq + offset, last.ts, "profile.finished", data, "")))
        await wait_for(lambda: app.state.last_seq == last.seq + 2)
        live_screen(app).flush()
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_live_screen_with_graph_timings(snap_compare: Any) -> None:
    """An evaluation that carries CUDA-graph times (task graph_timing) adds a graph column to the evaluation table;
    a shape whose capture failed shows a dash there."""
    app, runtime = make_live_app()

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot, runtime)
        last = runtime.events[-1]
        shapes = [{"name": f"S{i}", "correct": True, "rel_err": 1.1e-7, "ms": ms, "baseline_ms": base,
                   "speedup": base / ms, "floor_ms": floor, "graph_ms": ms * 0.98, "baseline_graph_ms": base * 0.9,
                   "graph_speedup": base * 0.9 / (ms * 0.98)}
                  for i, (ms, base, floor) in enumerate(((0.0369, 0.0591, 0.028), (0.0211, 0.0244, 0.014),
                                                         (0.0385, 0.0402, 0.028), (0.1088, 0.1136, 0.056)), start=1)]
        del shapes[3]["graph_ms"], shapes[3]["baseline_graph_ms"], shapes[3]["graph_speedup"]
        shapes[3]["graph_error"] = "RuntimeError: operation not permitted when stream is capturing"
        result = {"verdict": "ok", "message": "correct on 4 shapes x 3 seeds", "speedup": 1.19,
                  "timing_comparable": True, "shapes": shapes}
        app.post_message(JournalEvent(Event(last.seq + 1, last.ts, "eval.finished", {"attempt": 5, "result": result},
                                            "")))
        await wait_for(lambda: app.state.last_seq == last.seq + 1)
        live_screen(app).flush()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_event_detail_modal(snap_compare: Any) -> None:
    """`l` lists the recent events; Enter on eval.finished shows its journal line whole, as indented JSON."""
    app, runtime = make_live_app()

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot, runtime)
        await pilot.press("l", "down", "down", "down", "enter")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_bad_theme_is_skipped_with_a_notification(snap_compare: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user theme with a bad colour is skipped and the default theme used; both facts are said on screen."""
    monkeypatch.chdir(REPO)
    app, runtime = make_live_app(theme="mine", themes_dir=Path("tests/fixtures/ui/themes"))

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot, runtime)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_review_session_list(snap_compare: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`workbench review`: every session with task, agent, status, attempts, best and running time; a broken one too."""
    monkeypatch.chdir(REPO)
    app = make_review_app()

    async def run_before(pilot: Pilot[Any]) -> None:
        screen = app.screen
        assert isinstance(screen, SessionsScreen)
        await wait_for(lambda: screen.query_one(DataTable).row_count == 3)
        await pilot.press("down")

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_review_timeline_with_a_marked_diff(snap_compare: Any) -> None:
    """One session: plots with the selected attempt marked, the timeline, the diff from the marked best to attempt 30
    (a human edit), and the ledger as it stood after attempt 30."""
    app = make_review_app(REPO / SESSIONS, LONG_ID)

    async def run_before(pilot: Pilot[Any]) -> None:
        await review_loaded(pilot)
        await pilot.press("b", "m", *["up"] * 10)
        app.clear_notifications()
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
