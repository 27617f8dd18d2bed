"""Behaviour of the live TUI driven with Pilot: stop, nudge, pause, questions, worker errors, keymap, batching."""

from __future__ import annotations

import signal
import threading
from concurrent.futures import Future

import pytest
from textual.message import Message
from textual.widgets import Checkbox, DataTable, TextArea

from tests.snapshot_apps.fake_runtime import FakeRuntime, load_events
from tests.snapshot_apps.live_app import capture_notes, live_screen, make_live_app, settle, wait_for
from tests.snapshot_apps.live_app import pinned_utc  # noqa: F401 - autouse: log times in UTC
from workbench.agent.commands import Command
from workbench.journal import Event
from workbench.ui.messages import JournalEvent, Question, RunFinished
from workbench.ui.screens.error import ErrorScreen
from workbench.ui.screens.help import HelpScreen
from workbench.ui.screens.live import LiveScreen
from workbench.ui.screens.nudge import NudgeScreen
from workbench.ui.screens.question import QuestionScreen
from workbench.ui import formatting as fmt
from workbench.ui.palette import theme_style
from workbench.ui.widgets.eval_table import EvalTable
from workbench.ui.widgets.event_log import EventLog
from workbench.ui.widgets.kernel_view import KernelView
from workbench.ui.widgets.keyed_table import KeyedTable
from workbench.ui.widgets.memory_panel import MemoryPanel
from workbench.ui.widgets.status_bar import StatusBar

SIZE = (120, 40)



async def test_replay_fills_every_pane() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        screen = live_screen(app)
        assert app.state.last_seq == 32 and app.state.best == 4
        kernel = screen.query_one(KernelView)
        assert kernel.shown is not None and kernel.shown[0] == 5
        assert "BLOCK_SIZE=2048" in kernel.query_one(TextArea).text
        table = screen.query_one(EvalTable).query_one(KeyedTable)
        assert list(table.rows) == ["S1", "S2", "S3"]
        assert table.get_cell("S1", "ms").plain == "0.0385"
        assert table.get_cell("S2", "speedup").plain == "1.44×"
        log = screen.query_one(EventLog)
        assert log.line_count == 32
        assert "eval.finished" in log.lines[28] and "attempt 5: ok" in log.lines[28]
        memory = str(screen.query_one(MemoryPanel).query_one("#memory-text").render())
        assert "fuse the max and sum passes" in memory and "ledger (4)" in memory
        status = screen.query_one(StatusBar)
        assert status.run_state == "running" and status.has_class("-running")
        summary = str(status.query_one("#summary").render())
        assert "attempt 5" in summary and "7/200" in summary and "1.50×" in summary and "#4" in summary
        # frozen clock 22:14:02, run started 22:13:00.17
        assert "0:01:01" in str(status.query_one("#clock").render())


async def test_events_reach_the_log_in_batches_not_one_write_each(monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[int] = []
    original = EventLog.write_events

    def counting(self: EventLog, lines: list[str]) -> None:
        writes.append(len(lines))
        original(self, lines)

    monkeypatch.setattr(EventLog, "write_events", counting)
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
    assert sum(writes) == 32
    assert len(writes) < 32 / 4, f"one write per event is what the flush tick exists to avoid: {writes}"


async def test_a_stop_signal_stops_the_runtime_with_its_reason_says_so_then_exits() -> None:
    release = threading.Event()
    app, runtime = make_live_app(FakeRuntime(release=release))
    messages: list[Message] = []
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await settle(pilot, runtime)
        notes = capture_notes(app)
        # What the signal watcher thread does on SIGTERM (WorkbenchApp.run installs it for a real terminal).
        threading.Thread(target=app.stop_for_signal, args=(signal.SIGTERM,)).start()
        await wait_for(runtime.saw_stop.is_set)
        await wait_for(lambda: app.run_state == "stopping")
        assert any("stopped by signal SIGTERM: stopping" in n for n in notes), notes
        release.set()
        await wait_for(lambda: not app.is_running)
    assert app.return_value == "stopped by signal SIGTERM"
    stopped = [m.event for m in messages if isinstance(m, JournalEvent) and m.event.type == "run.stopped"]
    assert [e.data["reason"] for e in stopped] == ["stopped by signal SIGTERM"]


async def test_q_stops_the_runtime_shows_stopping_then_exits() -> None:
    release = threading.Event()
    app, runtime = make_live_app(FakeRuntime(release=release))
    messages: list[Message] = []
    async with app.run_test(size=SIZE, message_hook=messages.append) as pilot:
        await settle(pilot, runtime)
        await pilot.press("q")
        await wait_for(runtime.saw_stop.is_set)
        live_screen(app).flush()
        await pilot.pause()
        # The runtime has seen stop but not returned: the UI stays up and says so.
        assert app.is_running and app.run_state == "stopping"
        assert live_screen(app).query_one(StatusBar).has_class("-stopping")
        release.set()
        await wait_for(lambda: not app.is_running)
    assert runtime.finished.is_set()
    assert app.return_value == "stopped by the person"
    kinds = [m.event.type for m in messages if isinstance(m, JournalEvent)]
    assert kinds[-1] == "run.stopped"
    finished = [i for i, m in enumerate(messages) if isinstance(m, RunFinished)]
    stopped = max(i for i, m in enumerate(messages) if isinstance(m, JournalEvent))
    assert finished and finished[0] > stopped, "RunFinished must come after the last journaled event"


async def test_second_q_exits_without_waiting() -> None:
    release = threading.Event()
    app, runtime = make_live_app(FakeRuntime(release=release))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot, runtime)
            await pilot.press("q")
            await wait_for(runtime.saw_stop.is_set)
            await pilot.press("q")
            await wait_for(lambda: not app.is_running)
        assert not runtime.finished.is_set()
    finally:
        release.set()
    assert runtime.finished.wait(5)


async def test_n_opens_the_nudge_dialog_and_queues_a_command() -> None:
    app, runtime = make_live_app(FakeRuntime(serve_commands=False))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        await pilot.press("n")
        assert isinstance(app.screen, NudgeScreen)
        await pilot.press(*"warps=8")
        await pilot.press("f2")
        assert app.screen.query_one(Checkbox).value is True
        await pilot.press("enter")
        assert isinstance(app.screen, LiveScreen)
        assert app.commands.get_nowait() == Command("nudge", "warps=8", True)


async def test_empty_nudge_is_refused_and_escape_sends_nothing() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        await pilot.press("n", "enter")
        assert isinstance(app.screen, NudgeScreen), "an empty nudge must not close the dialog"
        await pilot.press("escape")
        assert isinstance(app.screen, LiveScreen)
        await pilot.pause(0.05)
        assert runtime.commands_seen == []


async def test_a_nudge_round_trips_through_the_runtime_into_the_goal_panel() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        await pilot.press("n", *"regs", "f2", "enter")
        await wait_for(lambda: app.state.last_seq >= 34)
        live_screen(app).flush()
        await pilot.pause()
        assert runtime.commands_seen == [Command("nudge", "regs", True)]
        assert [n["text"] for n in app.state.active_nudges()][-1] == "regs"
        memory = str(live_screen(app).query_one(MemoryPanel).query_one("#memory-text").render())
        assert "● regs" in memory


async def test_p_toggles_pause_through_the_command_queue() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        await pilot.press("p")
        await wait_for(lambda: app.state.status == "paused")
        live_screen(app).flush()
        assert live_screen(app).query_one(StatusBar).has_class("-paused")
        await pilot.press("p")
        await wait_for(lambda: app.state.status == "running")
        assert [c.kind for c in runtime.commands_seen] == ["pause", "resume"]


async def test_pause_pressed_twice_before_the_runtime_answers_sends_pause_then_resume() -> None:
    app, runtime = make_live_app(FakeRuntime(serve_commands=False))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        await pilot.press("p")
        assert app.run_state == "pausing"
        await pilot.press("p")
        assert [app.commands.get_nowait().kind, app.commands.get_nowait().kind] == ["pause", "resume"]


async def test_commands_are_disabled_once_the_run_is_over() -> None:
    app, runtime = make_live_app(FakeRuntime(hold=False))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: app.run_over)
        await pilot.press("p", "n")
        assert isinstance(app.screen, LiveScreen)
        assert app.commands.empty()
        await pilot.press("q")
        await wait_for(lambda: not app.is_running)
    assert app.return_value == "replay finished"


async def test_question_from_the_runtime_is_answered_through_its_future() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        future: Future[str] = Future()
        # Posted from another thread, exactly as UiBridge.ask does from the agent worker.
        threading.Thread(target=lambda: app.post_message(Question("Use fp16 accumulators?", future))).start()
        await wait_for(lambda: isinstance(app.screen, QuestionScreen) and bool(app.screen.query("#answer")))
        await pilot.press(*"fp32", "enter")
        assert future.result(timeout=1) == "fp32"
        declined: Future[str] = Future()
        app.post_message(Question("Stop now?", declined))
        await wait_for(lambda: isinstance(app.screen, QuestionScreen) and bool(app.screen.query("#answer")))
        await pilot.press("escape")
        assert declined.cancelled()


async def test_runtime_error_becomes_a_modal_not_a_crash() -> None:
    app, runtime = make_live_app(FakeRuntime(fail=RuntimeError("evaluator pool died")))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: isinstance(app.screen, ErrorScreen) and bool(app.screen.query("#hint")))
        error = str(app.screen.query_one("#error").render())
        assert "RuntimeError: evaluator pool died" in error
        assert "workbench resume 20261129-221300-softmax-7f3a" in str(app.screen.query_one("#hint").render())
        assert app.is_running and app.run_over
        await pilot.press("escape")
        assert isinstance(app.screen, LiveScreen)
        await pilot.press("q")
        await wait_for(lambda: not app.is_running)


async def test_keymap_remaps_bindings_by_id() -> None:
    app, runtime = make_live_app(keymap={"nudge": "m", "help": "f2"})
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        await pilot.press("n")
        assert isinstance(app.screen, LiveScreen)
        await pilot.press("m")
        assert isinstance(app.screen, NudgeScreen)
        await pilot.press("escape", "f2")
        assert isinstance(app.screen, HelpScreen)
        rows = app.screen.query_one(DataTable)
        keys = {rows.get_row_at(i)[2].plain: rows.get_row_at(i)[0].plain for i in range(rows.row_count)}
        assert keys["nudge"] == "m" and keys["quit"] == "q"


async def test_unknown_keymap_id_is_reported() -> None:
    app, runtime = make_live_app(keymap={"nudj": "m"})
    notes = capture_notes(app)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
    assert any("nudj" in note for note in notes)


async def test_eval_table_changes_rows_by_key() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        table = live_screen(app).query_one(EvalTable).query_one(KeyedTable)
        last = load_events()[-1]
        result = {"verdict": "ok", "message": "", "speedup": 1.7, "timing_comparable": True,
                  "shapes": [{"name": "S10", "correct": True, "rel_err": 1e-7, "ms": 0.5, "baseline_ms": 0.9,
                              "speedup": 1.8, "floor_ms": 0.2},
                             {"name": "S2", "correct": True, "rel_err": 1e-7, "ms": 0.02, "baseline_ms": 0.0352,
                              "speedup": 1.76, "floor_ms": 0.014}]}
        app.post_message(JournalEvent(Event(last.seq + 1, last.ts, "eval.finished", {"attempt": 5, "result": result},
                                            "")))
        await wait_for(lambda: app.state.last_seq == last.seq + 1)
        live_screen(app).flush()
        assert list(table.rows) == ["S2", "S10"]
        assert table.get_cell("S2", "ms").plain == "0.02"
        assert [cells[0].plain for cells in table.rows.values()] == ["S2", "S10"]


async def test_the_status_line_counts_down_to_the_next_try_while_the_model_api_is_failing() -> None:
    """From the journal alone (llm.response ok: false carries the wait), so an attached TUI shows it as well."""
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        status = live_screen(app).query_one(StatusBar)
        last = load_events()[-1]
        # 8 s before the frozen clock (22:14:02) the 3rd try failed and chose a 20 s wait: 12 s are left.
        failed = {"ok": False, "turn": 7, "try": 3, "error": "APIConnectionError: Connection error. (Connection "
                  "refused)", "status": 0, "retry_in": 20.0, "retry_after": False}
        app.post_message(JournalEvent(Event(last.seq + 1, "2026-11-29T22:13:54.000Z", "llm.response", failed, "")))
        await wait_for(lambda: app.state.last_seq == last.seq + 1)
        live_screen(app).flush()
        await pilot.pause()
        assert "waiting for the model API (retry 3 in 12 s)" in str(status.query_one("#clock").render())
        reply = {"ok": True, "turn": 7, "try": 4, "content": [], "input_tokens": 10, "output_tokens": 5}
        app.post_message(JournalEvent(Event(last.seq + 2, "2026-11-29T22:14:01.000Z", "llm.response", reply, "")))
        await wait_for(lambda: app.state.last_seq == last.seq + 2)
        live_screen(app).flush()
        await pilot.pause()
        assert "waiting for the model API" not in str(status.query_one("#clock").render())


async def test_a_theme_change_recolours_the_eval_tables_cells() -> None:
    """The cells carry theme colours as Rich styles; the same text in a new colour must not count as unchanged."""
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        table = live_screen(app).query_one(EvalTable).query_one(KeyedTable)
        app.theme = "workbench-light"
        await pilot.pause()
        assert table.get_cell("S1", "shape").style == theme_style(app.theme_variables, "text-primary", bold=True)


async def test_eval_table_columns_widen_when_an_update_brings_longer_values() -> None:
    """Rows are updated in place; a longer value must widen its column, not be clipped to the old width."""
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        table = live_screen(app).query_one(EvalTable).query_one(KeyedTable)
        last = load_events()[-1]
        result = {"verdict": "ok", "message": "", "speedup": 0.01, "timing_comparable": True,
                  "shapes": [{"name": s.get("name"), "correct": True, "rel_err": 1e-7, "ms": 1234567.0,
                              "baseline_ms": 9876543.0, "speedup": 8.0, "floor_ms": 0.2}
                             for s in app.state.attempts[max(app.state.attempts)].shapes or [{"name": "S1"}]]}
        app.post_message(JournalEvent(Event(last.seq + 1, last.ts, "eval.finished", {"attempt": 5, "result": result},
                                            "")))
        await wait_for(lambda: app.state.last_seq == last.seq + 1)
        live_screen(app).flush()
        await pilot.pause()
        for key in ("ms", "baseline_ms"):
            widest = max(table.get_cell(row, key).cell_len for row in table.rows)
            assert table.content_width(key) >= widest, key


async def test_events_already_in_the_starting_state_are_not_applied_twice() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        calls = app.state.tool_calls
        app.post_message(JournalEvent(load_events()[-1]))
        await pilot.pause()
        assert app.state.tool_calls == calls and app.state.last_seq == 32


async def test_eval_table_gains_a_graph_column_when_an_evaluation_has_graph_times() -> None:
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        table = live_screen(app).query_one(EvalTable).query_one(KeyedTable)
        assert "graph_speedup" not in table.columns  # the shipped session has event times only
        last = load_events()[-1]
        result = {"verdict": "ok", "message": "", "speedup": 1.4, "timing_comparable": True,
                  "shapes": [{"name": "K1", "correct": True, "rel_err": 4e-3, "ms": 1.25, "baseline_ms": 1.84,
                              "speedup": 1.47, "floor_ms": 0.19, "graph_ms": 1.245, "baseline_graph_ms": 1.833,
                              "graph_speedup": 1.472},
                             {"name": "K7", "correct": True, "rel_err": 4e-3, "ms": 0.225, "baseline_ms": 1.256,
                              "speedup": 5.58, "floor_ms": 0.024, "graph_error": "capture failed"}]}
        app.post_message(JournalEvent(Event(last.seq + 1, last.ts, "eval.finished", {"attempt": 5, "result": result},
                                            "")))
        await wait_for(lambda: app.state.last_seq == last.seq + 1)
        live_screen(app).flush()
        assert "graph_speedup" in table.columns
        assert table.get_cell("K1", "graph_speedup").plain == fmt.speedup(1.472)
        assert table.get_cell("K7", "graph_speedup").plain == fmt.DASH


async def test_screen_keys_reach_the_screen_whichever_pane_has_focus() -> None:
    """With the read-only kernel editor focused (a click on the kernel pane), `f` and `d` still cycle the log's
    filter and the kernel view: the editor takes no typed keys."""
    app, runtime = make_live_app()
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, runtime)
        screen = live_screen(app)
        kernel, log = screen.query_one(KernelView), screen.query_one(EventLog)
        screen.query_one("#kernel-source", TextArea).focus()
        await pilot.pause()
        view, shown = kernel.view, log.filter
        await pilot.press("f")
        await pilot.pause()
        assert log.filter != shown and isinstance(app.focused, TextArea)
        await pilot.press("d")
        await pilot.pause()
        assert kernel.view != view
