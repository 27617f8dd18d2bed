"""The live screen's newer panes with Pilot: kernel diff views, log filters, the event list, profile and metrics."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from rich.cells import cell_len
from rich.text import Text
from textual.content import Content
from textual.geometry import Region
from textual.message import Message
from textual.scrollbar import ScrollBarRender
from textual.messages import Layout
from textual.widgets import DataTable, Sparkline, Static, TextArea

from tests.snapshot_apps.fake_runtime import FloodRuntime, load_events
from tests.snapshot_apps.live_app import live_screen, make_live_app, settle, wait_for
from tests.snapshot_apps.live_app import pinned_utc  # noqa: F401 - autouse: log times in UTC
from workbench.journal import Event
from workbench.ui.formatting import EVENT_FILTERS, next_filter, passes
from workbench.ui.messages import JournalEvent
from workbench.ui.screens.events import EventDetailScreen, EventListScreen, detail_text
from workbench.ui.screens.live import FLUSH_INTERVAL, PANE_GROUPS, PANES_INTERVAL, LiveScreen
from workbench.ui.widgets.diff_view import DiffView
from workbench.ui.widgets.eval_table import EvalTable
from workbench.ui.widgets.event_log import EventHighlighter, EventLog, LogScrollBar, thumb_eighths
from workbench.ui.widgets.kernel_view import KernelView
from workbench.ui.widgets.keyed_table import KeyedTable
from workbench.ui.widgets.metrics_bar import MetricsBar
from workbench.ui.widgets.profiler_table import ProfilerTable, kernel_rows, ncu_metrics
from workbench.ui.widgets.status_bar import StatusBar

SIZE = (120, 40)



async def post(app: Any, kind: str, data: dict[str, Any]) -> None:
    """Post one more journaled event, as the bridge would, and flush it onto the screen."""
    seq = app.state.last_seq + 1
    app.post_message(JournalEvent(Event(seq, load_events()[-1].ts, kind, data, "")))
    await wait_for(lambda: app.state.last_seq == seq)
    live_screen(app).flush()


def profile(n: int, scale: float) -> dict[str, Any]:
    return {"attempt": n, "summary": "memory-bound",
            "kernels": [{"name": "_softmax_kernel", "calls": 3, "total_ms": 0.074 * scale, "mean_ms": 0.0247 * scale,
                         "share": 0.94},
                        {"name": "fill_", "calls": 3, "total_ms": 0.0048, "mean_ms": 0.0016, "share": 0.06}],
            "ncu": {"dram__throughput.avg.pct_of_peak_sustained_elapsed": 61.0 * scale}}


async def test_d_cycles_source_diff_vs_parent_diff_vs_best() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        kernel = live_screen(app).query_one(KernelView)
        assert kernel.view == "source" and not kernel.has_class("-diff")
        assert kernel.query_one(TextArea).display and not kernel.query_one(DiffView).display
        await pilot.press("d")
        diff = kernel.query_one(DiffView)
        assert kernel.view == "parent" and kernel.has_class("-diff") and diff.display
        assert not kernel.query_one(TextArea).display
        assert diff.text.startswith("--- attempt 4 (parent)\n+++ attempt 5\n")
        assert "-    _softmax_kernel[(rows,)](x, y, cols, x.stride(0), BLOCK_SIZE=1024, num_warps=8)" in diff.text
        assert "+    _softmax_kernel[(rows,)](x, y, cols, x.stride(0), BLOCK_SIZE=2048, num_warps=16)" in diff.text
        assert "diff from parent #4 · +1 −1 lines" in str(kernel.border_subtitle)
        assert "diff vs parent" in str(kernel.border_title)
        await pilot.press("d")
        assert kernel.view == "best" and diff.text.startswith("--- attempt 4 (best)\n")
        await pilot.press("d")
        assert kernel.view == "source" and kernel.query_one(TextArea).display
        # Attempt 4 is the best: on it, the best view has nothing to compare and says so.
        kernel.show(app.state.attempts[4], best=4, attempts=app.state.attempts)
        kernel.view = "best"
        assert diff.text == "" and "attempt 4 is the best" in diff.note


async def test_the_diff_follows_new_attempts_and_is_not_recomputed_per_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    import workbench.ui.widgets.kernel_view as kernel_view

    calls: list[str] = []
    original = kernel_view.unified

    def counting(*args: Any, **kwargs: Any) -> str:
        calls.append(args[3])
        return original(*args, **kwargs)

    monkeypatch.setattr(kernel_view, "unified", counting)
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        await pilot.press("d")
        for _ in range(5):
            live_screen(app).flush()
            live_screen(app).refresh_panes()
        assert calls == ["attempt 5"]
        source = app.state.attempts[5].source.replace("num_warps=16", "num_warps=32")
        await post(app, "attempt.written", {"attempt": 6, "parent": 5, "sha256": "06" + "ef" * 31, "author": "agent",
                                            "note": "more warps", "params": {}, "source": source})
        diff = live_screen(app).query_one(DiffView)
        assert calls == ["attempt 5", "attempt 6"]
        assert diff.text.startswith("--- attempt 5 (parent)\n+++ attempt 6\n") and "num_warps=32" in diff.text


async def test_f_cycles_the_log_filter_and_rewrites_from_the_recent_events() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        log = live_screen(app).query_one(EventLog)
        assert log.line_count == 32 and log.filter == "all"
        await pilot.press("f")
        assert log.filter == "attempts"
        kinds = [line.split()[2] for line in log.lines]
        assert kinds and set(kinds) <= {"attempt.written", "eval.finished", "ledger.updated", "profile.finished"}
        assert log.line_count == 5 + 5 + 3 and "attempts + evals" in str(log.border_title)
        await post(app, "tool.call", {"call_id": "c000008", "tool": "read_kernel", "args": {}})
        await post(app, "eval.finished", {"attempt": 5, "result": {"verdict": "timeout", "message": "too slow"}})
        assert log.line_count == 14 and "attempt 5: timeout" in log.lines[-1]
        assert log.events_written == 34 and "34 events" in str(log.border_subtitle)
        await pilot.press("f")
        assert log.filter == "tools" and all(" tool." in line for line in log.lines) and log.line_count == 14
        await pilot.press("f", "f")
        assert log.filter == "all" and log.line_count == 34


async def test_f_repaints_the_log_alone_with_no_layout_of_the_screen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key-to-paint of f under load (issue 17 item 6): the key's frame is the log's, nothing else's.

    A layout reflows every widget of the screen; the log's size never depends on its lines, so neither a batch nor a
    filter asks for one. Events still waiting for the tick reach the log at once; the other panes follow on the tick.
    """
    redrawn: list[bool] = []
    in_key = [False]
    draw, cycle_filter = LiveScreen._draw, LiveScreen.action_cycle_filter

    def counting(self: LiveScreen, group: str) -> None:
        redrawn.append(in_key[0])
        draw(self, group)

    def key(self: LiveScreen) -> None:
        in_key[0] = True
        try:
            cycle_filter(self)
        finally:
            in_key[0] = False

    monkeypatch.setattr(LiveScreen, "_draw", counting)
    monkeypatch.setattr(LiveScreen, "action_cycle_filter", key)
    messages: list[Message] = []
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await settle(pilot, runtime)
        log = live_screen(app).query_one(EventLog)
        wide = log.virtual_size.width
        assert wide == max(cell_len(line) for line in log.lines)
        seq = app.state.last_seq + 1
        redrawn.clear()
        messages.clear()
        app.post_message(JournalEvent(Event(seq, load_events()[-1].ts, "eval.finished",
                                            {"attempt": 5, "result": {"verdict": "timeout", "message": "slow"}}, "")))
        await wait_for(lambda: app.state.last_seq == seq)
        await pilot.press("f")
        assert log.filter == "attempts" and "attempt 5: timeout" in log.lines[-1], "f writes what is pending first"
        await wait_for(lambda: redrawn)  # the tick brings the other panes up to the event
        assert not any(redrawn), "f itself redrew the other panes"
        bar = log.vertical_scrollbar
        assert bar.window_virtual_size == log.line_count == log.virtual_size.height
        assert log.scroll_y == log.max_scroll_y, "a new filter shows its newest line"
        assert log.virtual_size.width == wide > max(cell_len(line) for line in log.lines), \
            "the sideways extent is the widest kept event's, whatever the filter (its scrollbar is not redrawn)"
        await pilot.press("f", "f", "f")
        await pilot.pause()
        assert log.filter == "all" and bar.window_virtual_size == log.line_count == 33
        assert not [m for m in messages if isinstance(m, Layout) and m.widget is log], "the log laid out the screen"


async def test_under_a_flood_the_log_follows_every_tick_and_each_pane_group_at_most_twice_a_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy run (several attempts a second) redraws each group of the other panes on the tick no more often than
    PANES_INTERVAL and one group a tick at most, while the log takes each tick's batch; once events stop, every group
    catches up within a few ticks."""
    import asyncio
    import time

    drawn: list[tuple[float, str]] = []
    batches: list[float] = []
    draw, write_events = LiveScreen._draw, EventLog.write_events

    def counting_draws(self: LiveScreen, group: str) -> None:
        drawn.append((time.monotonic(), group))
        draw(self, group)

    def counting_batches(self: EventLog, events: Any) -> None:
        batches.append(time.monotonic())
        write_events(self, events)

    monkeypatch.setattr(LiveScreen, "_draw", counting_draws)
    monkeypatch.setattr(EventLog, "write_events", counting_batches)
    runtime = FloodRuntime(rate=100)
    app, _ = make_live_app(runtime)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        drawn.clear()
        batches.clear()
        await asyncio.sleep(2.0)
        assert {group for _, group in drawn} == set(PANE_GROUPS), drawn
        for group in PANE_GROUPS:
            times = [t for t, g in drawn if g == group]
            gaps = [b - a for a, b in zip(times, times[1:])]
            assert gaps and min(gaps) >= PANES_INTERVAL - 0.01, (group, gaps)
        assert len(batches) >= 6 and len(batches) >= len(drawn) - 1, (len(batches), len(drawn))
        assert min(b[0] - a[0] for a, b in zip(drawn, drawn[1:])) >= FLUSH_INTERVAL / 2, "one group a tick"
        runtime.rate = 1e-3  # the next event is due in 1,000 s
        await asyncio.sleep(0.1)
        seq = app.state.last_seq
        await asyncio.sleep(PANES_INTERVAL + len(PANE_GROUPS) * FLUSH_INTERVAL + 0.1)
        assert app.state.last_seq == seq and not live_screen(app)._stale, "the panes caught up"


@pytest.fixture
def highlighted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every line the event log draws through Rich (its highlighter sees each), in order."""
    drawn: list[str] = []
    original = EventHighlighter.highlight

    def counting(self: EventHighlighter, text: Text) -> None:
        drawn.append(text.plain)
        original(self, text)

    monkeypatch.setattr(EventHighlighter, "highlight", counting)
    return drawn


async def test_the_log_renders_a_line_once_per_style(highlighted: list[str]) -> None:
    """Cycling the filter back draws lines already drawn from the cache; a new theme draws them again."""
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        log = live_screen(app).query_one(EventLog)
        shown = set(log.lines[-5:])
        assert shown <= set(highlighted), "the visible lines were drawn"
        for _ in range(4):
            await pilot.press("f")
            await pilot.pause()
        assert log.filter == "all"
        before = len(highlighted)
        log.refresh()
        await pilot.pause()
        assert len(highlighted) == before, "the same lines again: nothing to render"
        app.theme = next(name for name in app.available_themes if name != app.theme)
        await pilot.pause()
        assert shown <= set(highlighted[before:]), "a new theme renders the lines in its colours"


async def test_a_filter_key_finds_the_lines_that_arrived_in_its_view_drawn(highlighted: list[str]) -> None:
    """Lines arriving in a preset not shown are drawn as they arrive, so the key that switches to it draws none
    (issue 17 item 6: a window of new lines through Rich was most of the key's frame in tmux under load)."""
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        log = live_screen(app).query_one(EventLog)
        await pilot.press("f")
        assert log.filter == "attempts"
        for n in range(3):  # tool traffic: in the tools view and in all, not in the one shown
            await post(app, "tool.call", {"call_id": f"c9{n}", "tool": "read_kernel", "args": {}})
        await pilot.pause()
        assert any("read_kernel" in line for line in highlighted[-3:]), "drawn as they arrived"
        drawn = len(highlighted)
        await pilot.press("f")
        await pilot.pause()
        assert log.filter == "tools" and "read_kernel" in log.lines[-1]
        assert len(highlighted) == drawn, highlighted[drawn:]


async def test_kept_log_lines_follow_sideways_scrolling_and_the_width() -> None:
    """A line is kept as the window shows it, so scrolling sideways or a new width shows the line's other cells."""
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        log = live_screen(app).query_one(EventLog)
        last = log.line_count - 1 - log.scroll_y

        def shown() -> str:
            return log.render_line(last).text

        width = log.size.width
        assert shown() == log.lines[-1][:width].ljust(width)
        log.scroll_to(x=7, animate=False, immediate=True)
        await pilot.pause()
        assert shown() == log.lines[-1][7:7 + width].ljust(width)
        log.scroll_to(x=0, animate=False, immediate=True)
        await pilot.resize_terminal(100, 40)
        await pilot.pause()
        assert log.size.width < width and shown() == log.lines[-1][:log.size.width].ljust(log.size.width)


def test_the_scrollbar_key_tells_apart_every_drawing_textual_makes() -> None:
    """Two bars with the same thumb key draw the same segments, over sizes, lengths, windows and positions."""
    drawn: dict[tuple[int, tuple[int, int] | None], list[Any]] = {}
    for size in (1, 2, 7, 8, 23):
        for virtual in (0, 1, 5, 8, 9, 33, 500, 5000):
            for window in [w for w in (0, 1, 8, 9) if w < virtual or w == 0]:  # ScrollBar passes no other window
                for position in [p / 8 for p in range(0, 8 * max(1, virtual - window) + 1, 3)][:60]:
                    bar = ScrollBarRender(virtual_size=virtual, window_size=window, position=position)
                    segments = [(s.text, s.style) for s in ScrollBarRender.render_bar(
                        size=size, virtual_size=virtual, window_size=window, position=position).segments]
                    key = (size, thumb_eighths(size, bar))
                    assert drawn.setdefault(key, segments) == segments, (size, virtual, window, position)
    assert len(drawn) > 100


async def test_the_log_scrollbar_draws_what_a_fresh_one_draws() -> None:
    """The kept drawings of the log's scrollbar match a new drawing through filter keys, new events, scrolling and a
    hover; and a press mostly finds its bar drawn already."""
    app, runtime = make_live_app(FloodRuntime(rate=150.0))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        log = live_screen(app).query_one(EventLog)
        bar = log.vertical_scrollbar
        assert isinstance(bar, LogScrollBar) and bar.display

        def check() -> None:
            crop = Region(0, 0, *bar.size)
            kept = [(s.text, s.style) for strip in bar.render_lines(crop) for s in strip]
            bar._drawn.clear()
            assert kept == [(s.text, s.style) for strip in bar.render_lines(crop) for s in strip]

        for step in range(16):
            await pilot.press("f")
            await pilot.pause()
            check()
            if step == 5:
                log.scroll_to(y=log.max_scroll_y // 3, animate=False, immediate=True)
            if step == 9:
                bar.mouse_over = True
                await pilot.pause()
                check()
                bar.mouse_over = False
        runtime.rate = 0.01  # one more event, then none for 100 s: the four views each draw their bar once
        await pilot.pause(0.3)
        live_screen(app).flush()
        for _ in range(4):
            await pilot.press("f")
        await pilot.pause()
        drawn = len(bar._drawn)
        for _ in range(8):
            await pilot.press("f")
            await pilot.pause()
        assert len(bar._drawn) == drawn, "the views' bars were all drawn and kept"


async def test_each_preset_keeps_its_own_newest_lines_and_a_switch_takes_the_pending_events() -> None:
    """A preset's view is kept as events arrive (max_lines of its own), so a rare preset still shows its events
    after many others, and a filter key with events still pending writes them with the switch."""
    from textual.app import App, ComposeResult

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield EventLog(max_lines=3)

    def event(seq: int, kind: str, **data: Any) -> dict[str, Any]:
        return {"seq": seq, "ts": "2026-11-29T22:13:00.000Z", "type": kind, "data": data}

    async with One().run_test(size=(100, 12)) as pilot:
        log = pilot.app.query_one(EventLog)
        log.write_events([event(1, "nudge.received", id="n1", text="try BLOCK=64"),
                          *(event(2 + i, "tool.call", call_id=f"c{i}", tool="read_file", args={}) for i in range(5))])
        assert log.line_count == 3 and all("tool.call" in line for line in log.lines), "all: the newest 3"
        log.set_filter("nudges")
        assert [("n1" in line, "try BLOCK=64" in line) for line in log.lines] == [(True, True)], \
            "the nudge is older than the newest 3 events, and its preset kept it"
        log.set_filter("tools", [event(7, "tool.result", call_id="c4", tool="read_file", ok=True, summary="ok"),
                                 event(8, "error", message="boom")])
        assert log.filter == "tools" and log.line_count == 3 and "tool.result" in log.lines[-1]
        assert log.events_written == 8 and "8 events" in str(log.border_subtitle)
        log.set_filter("nudges")
        assert len(log.lines) == 2 and "boom" in log.lines[-1], "the error written with the switch is in its view"
        log.set_filter("all")
        assert [line.split()[2] for line in log.lines] == ["tool.call", "tool.result", "error"]
        await pilot.pause()


def test_filter_presets_cover_every_event_type_and_cycle() -> None:
    from workbench.journal.events import EVENT_TYPES

    keys = [k for k, _label, _types in EVENT_FILTERS]
    assert [next_filter(k) for k in keys] == keys[1:] + keys[:1] and next_filter("bogus") == "all"
    assert all(passes("all", {"type": t}) for t in EVENT_TYPES)
    for kind in ("error", "nudge.received", "nudge.acked"):
        assert passes("nudges", {"type": kind}) and not passes("tools", {"type": kind})
    unknown = {t for _k, _l, types in EVENT_FILTERS if types for t in types} - EVENT_TYPES
    assert not unknown, f"filter names types the journal does not have: {unknown}"


async def test_l_lists_recent_events_and_enter_shows_one_whole() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        await pilot.press("f", "l")
        listing = app.screen
        assert isinstance(listing, EventListScreen)
        table = listing.query_one(DataTable)
        assert listing.filter == "attempts" and table.row_count == 13 and table.cursor_row == 0
        assert [e["seq"] for e in listing.shown[:3]] == [31, 29, 28], "newest first"
        await pilot.press("down", "down")
        record = listing.selected()
        assert record is not None and record["seq"] == 28 and record["type"] == "attempt.written"
        await pilot.press("enter")
        detail = app.screen
        assert isinstance(detail, EventDetailScreen)
        text = str(detail.query_one("#event-json").render())
        assert '"type": "attempt.written"' in text and "characters, shown below" in text
        assert "def _softmax_kernel" in str(detail.query_one("#event-code-source").render())
        await pilot.press("escape")
        assert app.screen is listing
        await pilot.press("f")
        assert listing.filter == "tools" and table.row_count == 13
        await pilot.press("escape")
        assert isinstance(app.screen, LiveScreen)


def test_detail_text_pulls_multiline_sources_out_of_the_json() -> None:
    event = {"seq": 7, "ts": "t", "type": "attempt.written", "data": {"attempt": 1, "source": "a\nb\n", "note": "x"}}
    text, code = detail_text(event)
    assert code == {"source": "a\nb\n"} and '"source": "<4 characters, shown below>"' in text
    assert '"note": "x"' in text and event["data"]["source"] == "a\nb\n", "the event itself is left alone"


async def test_profile_pane_appears_with_the_first_profile_and_changes_rows_by_key() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        pane = live_screen(app).query_one(ProfilerTable)
        assert pane.has_class("-empty") and not pane.display
        await post(app, "profile.finished", profile(4, 1.0))
        table = pane.query_one(KeyedTable)
        assert not pane.has_class("-empty") and pane.display
        assert list(table.rows) == ["_softmax_kernel", "fill_"]
        assert table.get_cell("_softmax_kernel", "delta").plain == "–", "the best's own profile has no delta"
        await post(app, "profile.finished", profile(5, 0.8))
        assert table.get_cell("_softmax_kernel", "delta").plain == "-20%"
        assert table.get_cell("_softmax_kernel", "mean_ms").plain == "0.0198"
        ncu = str(pane.query_one("#ncu").render())
        assert "dram__throughput 48.8 (-12.2)" in ncu
        assert "Δ vs best #4" in str(pane.border_title)


def test_profile_data_in_the_profilers_own_layout_is_merged_per_kernel() -> None:
    nested = {"shapes": [{"name": "S1", "kernels": [{"name": "k", "calls": 2, "total_ms": 0.3},
                                                    {"name": "fill_", "calls": 2, "total_ms": 0.1}]},
                         {"name": "S2", "kernels": [{"name": "k", "calls": 2, "total_ms": 0.5}]}],
              "ncu": {"rows": [{"kernel": "k", "metrics": {"occupancy_pct": 38.0, "registers": 40}}]}}
    rows = kernel_rows(nested)
    assert [(r["name"], r["calls"], r["total_ms"]) for r in rows] == [("k", 4, 0.8), ("fill_", 2, 0.1)]
    assert rows[0]["mean_ms"] == pytest.approx(0.2) and rows[0]["share"] == pytest.approx(0.8 / 0.9)
    assert ncu_metrics(nested) == {"occupancy_pct": 38.0, "registers": 40}
    assert ncu_metrics({"ncu": {"a": {"value": 3, "unit": "%"}, "b": True}}) == {"a": 3}
    assert kernel_rows({}) == [] and ncu_metrics({"ncu": "junk"}) == {}


async def test_metrics_bar_shows_the_speedup_sparkline_tokens_cost_and_the_session() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        bar = live_screen(app).query_one(MetricsBar)
        spark = bar.query_one(Sparkline)
        assert list(spark.data or []) == [0.697, 0.895, 0.0, 1.505, 1.496]
        assert "no model tokens" in str(bar.query_one("#spend").render())
        assert str(bar.query_one("#session").render()) == "H200 · 20261129-221300-softmax-7f3a"
        await post(app, "llm.response", {"ok": True, "input_tokens": 12_345, "output_tokens": 678, "cost_usd": 0.0471})
        spend = str(bar.query_one("#spend").render())
        assert "tokens 12.3k in · 678 out · $0.05" in spend


async def test_an_evaluation_profile_and_a_later_ncu_run_show_together() -> None:
    """The runtime's own payloads: kernel tables per shape with the profiler's deltas, then Nsight Compute rows."""
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        await post(app, "profile.finished", {
            "attempt": 5, "source": "evaluation", "against": 4, "deltas": ["S1: time 0.0412 ms -> 0.0385 ms"],
            "shapes": [{"name": "S1", "ms": 0.0385, "kernels": [{"name": "_softmax_kernel", "kind": "kernel",
                                                                 "calls": 3, "total_ms": 0.11}]},
                       {"name": "S2", "ms": 0.0244, "kernels": [{"name": "_softmax_kernel", "kind": "kernel",
                                                                 "calls": 3, "total_ms": 0.07}]}]})
        await post(app, "profile.finished", {
            "attempt": 5, "source": "ncu",
            "ncu": {"shape": "S1", "rows": [{"kernel": "_softmax_kernel", "launches": 3,
                                             "metrics": {"occupancy_pct": 38.0, "dram_pct": 71.5}}]}})
        pane = live_screen(app).query_one(ProfilerTable)
        table = pane.query_one(KeyedTable)
        assert pane.display and list(table.rows) == ["_softmax_kernel"]
        assert table.get_cell("_softmax_kernel", "calls").plain == "6"
        footer = str(pane.query_one("#ncu").render())
        assert "vs #4 S1: time 0.0412 ms -> 0.0385 ms" in footer and "occupancy_pct 38" in footer
        assert app.profiles[5]["source"] == "ncu" and "shapes" in app.profiles[5]


async def test_a_new_attempt_keeps_the_persons_cursor_and_scroll_in_the_source_view() -> None:
    """Replacing the shown source must not jump to its end (the replacement's cursor) nor lose a scroll."""
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        kernel = live_screen(app).query_one(KernelView)
        editor = kernel.query_one(TextArea)
        attempts = app.state.attempts
        longer = {n: attempts[n] for n in attempts}
        for n, lines in ((4, 80), (5, 90)):
            source = "\n".join(f"# line {i} of attempt {n}" for i in range(lines))
            longer[n] = dataclasses.replace(attempts[n], source=source, sha256=f"sha-{n}-{lines}")
        kernel.show(longer[4], best=4, attempts=longer)
        await pilot.pause()
        assert editor.cursor_location == (0, 0) and editor.scroll_offset.y == 0
        editor.scroll_to(y=30, animate=False)
        await pilot.pause()
        kernel.show(longer[5], best=4, attempts=longer)
        await pilot.pause()
        await pilot.pause()
        assert editor.text.startswith("# line 0 of attempt 5")
        assert editor.cursor_location == (0, 0) and editor.scroll_offset.y == 30


async def test_the_kernel_pane_redrawn_with_nothing_new_is_not_repainted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick redraws the kernel pane whenever events arrive; the same attempt, verdict and view again must not
    repaint it (its titles are set only when they change), and a new best mark must."""
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        kernel = live_screen(app).query_one(KernelView)
        state = app.state
        current = state.current
        assert current is not None
        repaints: list[tuple[Any, ...]] = []
        monkeypatch.setattr(kernel, "refresh", lambda *regions, **kw: repaints.append(regions))
        kernel.show(current, best=state.best, attempts=state.attempts, evaluating=kernel.evaluating)
        assert repaints == []
        other_best = None if state.best == current.n else current.n
        kernel.show(current, best=other_best, attempts=state.attempts, evaluating=kernel.evaluating)
        assert len(repaints) == 1 and ("★ best" in str(kernel.border_title)) == (other_best == current.n)


async def test_a_pane_is_repainted_for_new_titles_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Setting a border title repaints the whole pane: the tables' panes set theirs on every redraw, so the same
    titles again must not repaint the pane."""
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        pane = live_screen(app).query_one(EvalTable)
        repaints: list[tuple[Any, ...]] = []
        monkeypatch.setattr(pane, "refresh", lambda *regions, **kw: repaints.append(regions))
        title = Content.assemble("evaluation · ", ("ok", "bold $text-success"))
        pane.set_titles(title, "on cuda:0")
        assert len(repaints) == 2 and str(pane.border_title) == title.markup
        pane.set_titles(Content.assemble("evaluation · ", ("ok", "bold $text-success")), Content("on cuda:0"))
        assert len(repaints) == 2
        pane.set_titles(Content.assemble("evaluation · ", ("ok", "bold $text-error")), "on cuda:0")
        assert len(repaints) == 3, "a title in another colour is a new title"


async def test_the_status_line_redraws_only_the_piece_that_reads_differently(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick redraws the status line; the clock moves every second and the summary only with the session, so a
    tick in which only the clock moved must not redraw the summary (a row of Rich work a second for nothing)."""
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        bar = live_screen(app).query_one(StatusBar)
        updates: list[str] = []
        for name in ("summary", "clock"):
            monkeypatch.setattr(bar.query_one(f"#{name}", Static), "update",
                                lambda *args, name=name, **kwargs: updates.append(name))
        now = datetime(2026, 11, 29, 22, 14, 2, tzinfo=timezone.utc)
        bar.show(app.state, run_state=app.run_state, mode=app.mode, now=now)
        updates.clear()
        bar.show(app.state, run_state=app.run_state, mode=app.mode, now=now + timedelta(seconds=5))
        assert updates == ["clock"]
        bar.show(app.state, run_state=app.run_state, mode=app.mode, now=now + timedelta(seconds=5))
        assert updates == ["clock"]
        app.state.tool_calls += 1
        bar.show(app.state, run_state=app.run_state, mode=app.mode, now=now + timedelta(seconds=5))
        assert updates == ["clock", "summary"]
