"""The fleet in the TUI: the live screen's fleet pane (slots, GPUs, attempts, phases, the queue, faults) and the
review timeline's slot column; snapshots at 120x40 and Pilot tests of how the pane follows events and views."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from tests.snapshot_apps.fake_runtime import FIXTURES, FakeRuntime, load_events
from tests.snapshot_apps.live_app import live_screen, make_live_app, review_loaded, settle, wait_for
from tests.snapshot_apps.live_app import pinned_utc  # noqa: F401 - autouse: log times in UTC
from tests.snapshot_apps.review_app import REPO, make_review_app
from workbench.agent.sink import FleetView
from workbench.fleet.api import EvalJob, SlotInfo, SlotStatus
from workbench.journal import Event
from workbench.ui.bridge import UiBridge
from workbench.ui.messages import FleetChanged, JournalEvent
from workbench.ui.widgets.fleet_panel import FleetPanel
from workbench.ui.widgets.keyed_table import KeyedTable

SIZE = (120, 40)
FLEET_RUN = FIXTURES / "fleet_run.jsonl"
"""The tuner on four H200 slots, cut with two evaluations running (make_fleet_run.py)."""
FLEET_SESSIONS = Path("tests/fixtures/ui/fleet_sessions")
FLEET_ID = "20261130-101500-softmax-f1ee"
CLOCK = "2026-11-30T10:17:10.000Z"
"""A little after the fleet fixture's last event."""


def fleet_app(**settings: Any):
    runtime = FakeRuntime(load_events(FLEET_RUN))
    return make_live_app(runtime, frozen_clock=CLOCK, **settings)


def slot(name: str, gpu: str) -> SlotInfo:
    return SlotInfo(name, "cuda", gpu=gpu, gpu_name="NVIDIA H200")


def live_view(queued: int = 1) -> FleetView:
    """What the runtime reports at the fixture's cut: the phases of the two evaluations running."""
    path = Path("attempts/kernel.py")
    return FleetView((
        SlotStatus(slot("cuda:0", "0"), "busy", EvalJob("j00009", 4, path, "", heldout=True, kind="heldout"),
                   "timing H2", 5),
        SlotStatus(slot("cuda:1", "1"), "busy", EvalJob("j00008", 6, path, ""), "correctness S1", 2),
        SlotStatus(slot("cuda:2", "2"), "skipped", None, "", 0, ["busy with another process (pid 4242, 71 GiB in use)"]),
        SlotStatus(slot("cuda:3", "3"), "retired", None, "", 1, ["CUDA context faulted twice (an illegal memory access)"]),
    ), queued)


def cells(panel: FleetPanel) -> dict[str, list[str]]:
    return {key: [c.plain for c in row] for key, row in panel.query_one(KeyedTable).rows.items()}


# -- snapshots --------------------------------------------------------------------------------------------------
def test_live_screen_with_the_fleet(snap_compare: Any) -> None:
    """Four slots: two busy (a held-out check on the reference slot, a candidate) with the runtime's phases, one
    skipped, one retired; one job queued."""
    app, runtime = fleet_app()

    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot, runtime)
        app.post_message(FleetChanged(live_view()))
        await wait_for(lambda: app.fleet is not None)
        live_screen(app).flush()
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_review_timeline_names_the_slot_of_each_result(snap_compare: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    app = make_review_app(FLEET_SESSIONS, FLEET_ID)

    async def run_before(pilot: Pilot[Any]) -> None:
        await review_loaded(pilot)
        await pilot.press("b")
        app.clear_notifications()
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


# -- behaviour --------------------------------------------------------------------------------------------------
async def test_the_pane_is_hidden_for_a_journal_from_before_the_fleet() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        assert not live_screen(app).query_one(FleetPanel).display
        await pilot.press("q")


async def test_the_journal_alone_shows_each_slot_its_attempt_the_queue_and_the_faults() -> None:
    app, runtime = fleet_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        panel = live_screen(app).query_one(FleetPanel)
        assert panel.display
        rows = cells(panel)
        assert list(rows) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
        assert rows["cuda:0"][:5] == ["cuda:0★", "H200 #0", "busy", "#4 chk", "held-out c…"]
        assert rows["cuda:1"][2:5] == ["busy", "#6", "evaluating"]
        assert rows["cuda:2"][2] == "skipped" and rows["cuda:2"][4].startswith("busy with")
        assert rows["cuda:3"][2] == "retired" and rows["cuda:3"][4].startswith("CUDA cont")
        title = str(panel.border_title)
        assert "2/4 busy" in title and "1 queued" in title and "ref cuda:0" in title
        assert str(panel.border_subtitle) == "out of service: cuda:2 skipped, cuda:3 retired"
        await pilot.press("q")


async def test_a_fleet_view_adds_phases_and_a_result_frees_its_slot() -> None:
    app, runtime = fleet_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        screen = live_screen(app)
        panel = screen.query_one(FleetPanel)
        app.post_message(FleetChanged(live_view(queued=3)))
        await wait_for(lambda: app.fleet_seen == 1)
        screen.flush()  # no journal event arrived: the view alone redraws the pane
        rows = cells(panel)
        assert rows["cuda:0"][4] == "timing H2" and rows["cuda:1"][4] == "correctnes…"
        assert "3 queued" in str(panel.border_title)
        last = runtime.events[-1]
        result = {"verdict": "ok", "message": "", "speedup": 1.7, "timing_comparable": True, "shapes": []}
        app.post_message(JournalEvent(Event(last.seq + 1, last.ts, "eval.finished", {
            "attempt": 6, "job": "j00008", "result": result, "slot": slot("cuda:1", "1").to_dict()}, "")))
        await wait_for(lambda: app.state.last_seq == last.seq + 1)
        app.post_message(FleetChanged(FleetView((*live_view().slots[:1], SlotStatus(slot("cuda:1", "1"), "idle",
                                                 None, "", 3), *live_view().slots[2:]), 0)))
        await wait_for(lambda: app.fleet_seen == 2)
        screen.flush()
        rows = cells(panel)
        assert rows["cuda:1"][2:] == ["idle", "–", "", "3"]
        assert "1/4 busy" in str(panel.border_title) and "0 queued" in str(panel.border_title)
        await pilot.press("q")


def test_the_bridge_posts_fleet_views_that_collapse_to_the_newest() -> None:
    posted: list[Any] = []
    bridge = UiBridge(posted.append)
    done = threading.Event()
    threading.Thread(target=lambda: (bridge.fleet(live_view(1)), bridge.fleet(live_view(2)), done.set())).start()
    assert done.wait(5)
    assert [type(m) for m in posted] == [FleetChanged, FleetChanged]
    assert posted[1].can_replace(posted[0]) and not posted[1].can_replace(JournalEvent(load_events()[0]))
