"""Review mode: the history read back from a journal, the report, `workbench review`, and Pilot navigation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable

from tests.snapshot_apps.live_app import review_loaded, wait_for
from tests.snapshot_apps.live_app import pinned_utc  # noqa: F401 - autouse: log times in UTC
from tests.snapshot_apps.review_app import LIVE_ID, LONG_ID, REPO, SESSIONS, copy_sessions, make_review_app
from workbench.cli import main
from workbench.journal import read_events
from workbench.session.state import fold
from workbench.ui.history import HistoryError, load_history, read_range, resolve_session_dir
from workbench.ui.report import render_report, spark
from workbench.ui.screens.events import EventDetailScreen, EventListScreen
from workbench.ui.screens.review import ReviewScreen
from workbench.ui.screens.sessions import SessionsScreen, session_row
from workbench.ui.widgets.diff_view import DiffView
from workbench.ui.widgets.kernel_view import KernelView
from workbench.ui.widgets.memory_panel import MemoryPanel
from workbench.ui.widgets.trend_plot import TrendPlot, column_of, plot_columns

SIZE = (120, 40)
LONG = REPO / SESSIONS / LONG_ID



def full_fold(folder: Path, upto: int | None = None) -> Any:
    return fold(e.to_dict() for e in read_events(folder / "events.jsonl") if upto is None or e.seq <= upto)


# -- the history, without a terminal ---------------------------------------------------------------------
@pytest.mark.parametrize("session", [LIVE_ID, LONG_ID])
def test_history_agrees_with_the_core_fold(session: str) -> None:
    """Skipping the data of tool and model-request lines must not change anything review shows."""
    history = load_history(REPO / SESSIONS / session)
    full = full_fold(REPO / SESSIONS / session)
    state = history.state
    for field in ("id", "task", "agent", "model", "device", "status", "stop_reason", "best", "tool_calls", "events",
                  "last_seq", "tokens_in", "tokens_out", "ledger", "memory", "nudges", "errors", "goal", "profile"):
        assert getattr(state, field) == getattr(full, field), field
    assert state.cost_usd == pytest.approx(full.cost_usd)
    assert state.elapsed_at() == pytest.approx(full.elapsed_at())
    assert state.attempts == full.attempts


def test_each_step_holds_the_ledger_memory_and_nudges_as_they_were() -> None:
    history = load_history(LONG)
    order = history.order
    assert order == list(range(1, 41)) and set(history.steps) == set(order)
    for n in (1, 12, 13, 25, 26, 40):
        step = history.steps[n]
        next_written = history.state.attempts[n + 1].written_seq if n < 40 else history.state.last_seq + 1
        assert step.seq == next_written - 1
        then = full_fold(LONG, step.seq)
        assert step.ledger == then.ledger and step.memory == then.memory and step.nudges == then.nudges
        assert history.step_range(n) == (history.state.attempts[n].written_seq, step.seq)
    # The nudge of attempt 12 is unacknowledged in no step, and absent before it; memory appears at 25.
    assert history.steps[11].nudges == [] and history.steps[12].nudges[0]["acked"] is True
    assert history.steps[24].memory == {} and "online softmax" in history.steps[25].memory["summary"]
    view = history.state_at(12)
    assert view.ledger is history.steps[12].ledger and view.goal == history.state.goal and view.last_seq == \
        history.steps[12].seq
    assert sorted(history.profiles) == [4, 12, 20, 28, 36]


def test_a_torn_last_line_is_skipped_and_a_broken_chain_is_named(tmp_path: Path) -> None:
    root = copy_sessions(tmp_path / "sessions")
    journal = root / LIVE_ID / "events.jsonl"
    with journal.open("ab") as f:
        f.write(b'{"seq": 33, "ts": "2026-11-29T22:13:39.000Z", "type": "tool.res')  # a writer mid-line
    assert load_history(root / LIVE_ID).state.last_seq == 32
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b"read_task", b"read_tusk")  # seq 4, a tool.call: checked, never decoded
    journal.write_bytes(b"".join(lines[:32]))
    with pytest.raises(HistoryError, match=r"events.jsonl:5: hash chain broken"):
        load_history(root / LIVE_ID)


def test_session_ids_resolve_by_prefix_and_unknown_ones_are_one_line(tmp_path: Path) -> None:
    root = REPO / SESSIONS
    assert resolve_session_dir(root, "20261128") == root / LONG_ID
    with pytest.raises(HistoryError, match="ambiguous"):
        resolve_session_dir(root, "2026112")
    with pytest.raises(HistoryError, match="did you mean 20261128-090000-softmax-c0de"):
        resolve_session_dir(root, "20261128-090000-softmax-c0df")
    with pytest.raises(HistoryError, match="not a session id"):
        resolve_session_dir(root, "../etc")
    with pytest.raises(HistoryError, match="no sessions folder"):
        resolve_session_dir(tmp_path / "none", "x")


def test_read_range_returns_one_steps_events() -> None:
    history = load_history(LONG)
    first, last = history.step_range(12)
    events = read_range(LONG, first, last)
    assert [e["seq"] for e in events] == list(range(first, last + 1))
    assert events[0]["type"] == "attempt.written" and "nudge.received" in {e["type"] for e in events}


def test_report_has_the_facts_the_timeline_the_ledger_and_the_best_kernel() -> None:
    history = load_history(LONG)
    report = render_report(history)
    best = history.state.best_attempt
    assert best is not None and best.n == 40
    assert report.startswith(f"# Session {LONG_ID}\n")
    assert "| **agent** | claude (claude-sonnet-4-5) |" in report
    assert f"Best: attempt 40, {best.speedup:.2f}× geomean speedup" in report
    assert "## Attempts (40)" in report and report.count("\n| ") >= 40
    assert "| 11 | 10 | agent | compile_error | – | – | S2 (online max+sum (one read fewer)) · BLOCK_SIZE" in report
    assert "| 30 | 29 | human | ok |" in report
    assert "| S3 | failed | more warps on long rows | 17, 18, 19, 20, 21, 22, 23, 24 | 16 warps starve" in report
    assert "## Memory (latest compaction)" in report and "## Nudges" in report
    assert "```python\n" + best.source.rstrip("\n") + "\n```" in report
    assert "```diff\n--- attempt 1\n+++ attempt 40\n" in report


def test_spark_marks_failures_as_gaps_and_buckets_long_series() -> None:
    assert spark([1.0, None, 2.0]) == "▁ █"
    assert len(spark([float(i) for i in range(500)], width=60)) == 60
    assert spark([]) == "" and spark([None, None]) == "  "


def test_plot_columns_stretch_short_series_and_bucket_long_ones() -> None:
    assert plot_columns([1.0, 2.0, 3.0], 5, max) == [1.0, None, 2.0, None, 3.0]
    assert plot_columns([1.0, 5.0, 2.0, 7.0], 2, max) == [5.0, 7.0]
    assert plot_columns([1.0, 5.0, 2.0, 7.0], 2, min) == [1.0, 2.0]
    assert [column_of(i, 3, 5) for i in range(3)] == [0, 2, 4]
    assert column_of(3, 4, 2) == 1


def test_review_export_writes_report_md_without_loading_textual(tmp_path: Path) -> None:
    root = copy_sessions(tmp_path / "sessions")
    code = (
        "import sys; from workbench.cli import main\n"
        f"rc = main(['review', '20261128', '--export', '--sessions-dir', {str(root)!r}])\n"
        "assert 'textual' not in sys.modules and 'rich' not in sys.modules, 'export must work without a terminal'\n"
        "raise SystemExit(rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = root / LONG_ID / "report.md"
    assert done.stdout.strip() == str(report)
    assert report.read_text(encoding="utf-8") == render_report(load_history(root / LONG_ID))


def test_review_cli_refuses_bad_input_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(REPO / SESSIONS)
    assert main(["review", "--export", "--sessions-dir", root]) == 2
    assert main(["review", "nope", "--export", "--sessions-dir", root]) == 2
    assert main(["review", "nope", "--sessions-dir", root]) == 2
    assert main(["review", "--sessions-dir", str(tmp_path / "missing")]) == 2
    broken = copy_sessions(tmp_path / "sessions")
    (broken / LIVE_ID / "events.jsonl").write_bytes(b"not json\n{}\n")
    assert main(["review", LIVE_ID, "--export", "--sessions-dir", str(broken)]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(errors) == 5 and all(line.startswith("workbench: ") for line in errors)
    assert "needs a session ID" in errors[0] and "no session 'nope'" in errors[1] and "no sessions folder" in errors[3]


def test_session_rows_show_broken_folders_and_open_intervals() -> None:
    from workbench.session import SessionStore

    rows = {r["id"]: r for r in map(session_row, SessionStore(REPO / SESSIONS).list())}
    assert rows[LONG_ID] == {"id": LONG_ID, "task": "softmax", "agent": "claude", "status": "stopped",
                                  "attempts": "40", "best": rows[LONG_ID]["best"], "duration": "0:08:38",
                                  "created": "2026-11-28 09:00"}
    # A killed run's interval is still open: it counts up to the last event, as SessionState.elapsed_at does.
    assert rows[LIVE_ID]["status"] == "running" and rows[LIVE_ID]["duration"] == "0:00:38"
    assert full_fold(REPO / SESSIONS / LIVE_ID).elapsed_at() == pytest.approx(38.0, abs=1)
    broken = rows["20261127-080000-broken-0bad"]
    assert broken["status"] == "broken" and broken["created"].startswith("not valid TOML")


# -- Pilot ------------------------------------------------------------------------------------------------
async def test_review_navigation_from_the_list_to_a_session_and_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    app = make_review_app()
    async with app.run_test(size=SIZE) as pilot:
        sessions = app.screen
        assert isinstance(sessions, SessionsScreen) and app.mode == "review"
        table = sessions.query_one(DataTable)
        await wait_for(lambda: table.row_count == 3)
        assert [k.value for k in table.rows] == [LIVE_ID, LONG_ID, "20261127-080000-broken-0bad"]
        await pilot.press("down", "enter")
        review = await review_loaded(pilot)
        assert review.history is not None and review.history.id == LONG_ID
        timeline = review.query_one("#timeline", DataTable)
        assert timeline.row_count == 40 and review.selected == 1
        await pilot.press("down", "down")
        assert review.selected == 3
        kernel = review.query_one(KernelView)
        assert kernel.attempt is not None and kernel.attempt.n == 3
        memory = review.query_one(MemoryPanel)
        assert "as of attempt 3" in str(memory.border_title)
        assert all(plot.marker == 2 for plot in review.query(TrendPlot))
        await pilot.press("b")
        assert review.selected == 40 and timeline.cursor_row == 39
        await pilot.press("escape")
        assert app.screen is sessions
        await pilot.press("down", "down", "enter")
        assert app.screen is sessions, "a broken session is reported, not opened"
        await pilot.press("q")
        await wait_for(lambda: not app.is_running)


async def test_mark_one_attempt_and_pick_another_to_see_their_diff() -> None:
    app = make_review_app(REPO / SESSIONS, "20261128")
    async with app.run_test(size=SIZE) as pilot:
        review = await review_loaded(pilot)
        kernel = review.query_one(KernelView)
        await pilot.press("d")
        assert kernel.view == "parent" and kernel.has_class("-diff")
        assert "attempt 1 has no parent" in kernel.query_one(DiffView).note
        await pilot.press("b", "m")
        assert review.marked == 40 and kernel.view == "marked"
        assert "40★◆" in review.query_one("#timeline", DataTable).get_cell("40", "n").plain
        await pilot.press(*["up"] * 10)
        diff = kernel.query_one(DiffView).text
        assert review.selected == 30
        assert diff.startswith("--- attempt 40 (marked)\n+++ attempt 30\n")
        assert "+    row = tl.program_id(0)  # edited by hand: prefetch next row" in diff
        await pilot.press("d")
        assert kernel.view == "source"
        await pilot.press("m")
        assert review.marked == 30, "m on another attempt moves the mark"
        await pilot.press("m")
        assert review.marked is None and "◆" not in review.query_one("#timeline", DataTable).get_cell("30", "n").plain


async def test_events_of_a_step_open_whole_and_export_writes_the_report(tmp_path: Path) -> None:
    root = copy_sessions(tmp_path / "sessions")
    app = make_review_app(root, LONG_ID)
    async with app.run_test(size=SIZE) as pilot:
        review = await review_loaded(pilot)
        await pilot.press(*["down"] * 11, "l")
        await wait_for(lambda: isinstance(app.screen, EventListScreen))
        listing = app.screen
        assert isinstance(listing, EventListScreen)
        assert {e["type"] for e in listing.events} >= {"attempt.written", "eval.finished", "nudge.received"}
        assert "attempt 12" in str(listing.query_one("#dialog").border_title)
        await pilot.press("enter")
        assert isinstance(app.screen, EventDetailScreen)
        await pilot.press("escape", "escape")
        assert app.screen is review
        await pilot.press("e")
        report = root / LONG_ID / "report.md"
        await wait_for(report.exists)
        assert report.read_text(encoding="utf-8").startswith(f"# Session {LONG_ID}")


async def test_a_session_that_cannot_be_read_says_so_on_screen(tmp_path: Path) -> None:
    root = copy_sessions(tmp_path / "sessions")
    (root / LONG_ID / "events.jsonl").unlink()
    app = make_review_app(root, "20261128-090000")
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        assert isinstance(screen, ReviewScreen)
        await wait_for(lambda: "no journal here" in str(screen.query_one("#review-header").render()))
        await pilot.press("escape")
        assert isinstance(app.screen, SessionsScreen)
