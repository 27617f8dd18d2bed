"""ReviewScreen: one past session: attempt timeline, speedup and time plots, diffs, and the ledger at any step."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from workbench.session.state import Attempt
from workbench.ui import formatting as fmt
from workbench.ui.history import HistoryError, SessionHistory, load_history, read_range, resolve_session_dir
from workbench.ui.palette import MUTED, theme_style, verdict_variable
from workbench.ui.report import attempt_label
from workbench.ui.screens.events import EventListScreen
from workbench.ui.widgets.kernel_view import KernelView
from workbench.ui.widgets.memory_panel import MemoryPanel
from workbench.ui.widgets.status_bar import short_device
from workbench.ui.widgets.trend_plot import TrendPlot

COLUMNS = (("n", "#", 5), ("verdict", "verdict", 10), ("ms", "ms", 7), ("speedup", "speedup", 7),
           ("what", "what it tried", 22))
"""(key, label, width) of the timeline; fixed widths, so thousands of rows need no measuring pass."""

SLOT_WIDTH = 9
"""The timeline's slot column (only for sessions whose results name their slot): 'cuda:3', 'cpu:1'."""

FIRST_ROWS = 200
"""Rows added before the screen shows anything else: a screenful and more, at once."""

CHUNK_ROWS = 500
"""Rows added per step after that, between which keys are handled: a long session stays responsive."""


class ReviewScreen(Screen[None]):
    """Read-only view of one session; its journal is read in a thread worker, never on the event loop."""

    CSS_PATH = "review.tcss"

    BINDINGS = [
        Binding("escape", "back", "Sessions", id="review.back", tooltip="Back to the list of sessions"),
        Binding("d", "cycle_kernel_view", "Diff", id="review.diff",
                tooltip="Kernel: source, diff against the parent, the best, the marked attempt"),
        Binding("m", "mark", "Mark", id="review.mark",
                tooltip="Mark this attempt, then select another to diff the two (m again clears)"),
        Binding("b", "goto_best", "Best", id="review.best", tooltip="Move to the best attempt"),
        Binding("l", "list_events", "Events", id="review.events",
                tooltip="List the events of this attempt's step and open any of them whole"),
        Binding("e", "export", "Export", id="review.export",
                tooltip="Write the session report as Markdown to sessions/<id>/report.md"),
    ]

    @dataclass
    class Loaded(Message):
        """The worker has read the session's journal."""

        history: SessionHistory | None
        """The session, or None when it could not be read."""
        error: str = ""
        """Why it could not be read."""

    @dataclass
    class Exported(Message):
        """The report worker has finished."""

        path: Path | None
        """Where the report went, or None."""
        error: str = ""

    @dataclass
    class StepEvents(Message):
        """The events of one attempt's step, read for the event list."""

        n: int
        events: list[dict[str, Any]]
        error: str = ""

    def __init__(self, root: Path, session_id: str, *, cursor_blink: bool = True) -> None:
        super().__init__()
        self.root = Path(root)
        """The sessions folder."""
        self.cursor_blink = cursor_blink
        """Whether the kernel pane's cursor blinks (off in tests)."""
        self.session_id = session_id
        """The id (or unique prefix) asked for."""
        self.history: SessionHistory | None = None
        """The session once loaded."""
        self.index: dict[int, int] = {}
        """Attempt number -> position in the timeline (and in the plots' series)."""
        self.selected: int | None = None
        """The attempt under the timeline cursor."""
        self.marked: int | None = None
        """The attempt marked for comparison."""
        self.rows_added = 0
        """Timeline rows added so far (they are added in chunks)."""
        self.slots = False
        """The session's results name the slot that measured them (a run on the evaluation pool): a column shows it."""

    def compose(self) -> ComposeResult:
        yield Static(Content(f" loading {self.session_id}…"), id="review-header")
        with Horizontal(id="review-main"):
            with Vertical(id="review-left"):
                with Vertical(id="trend"):
                    yield TrendPlot("speedup", value_format=lambda v: f"{v:.2f}×", summary=max,
                                    colour="$text-success", id="speed-plot")
                    yield TrendPlot("ms", value_format=fmt.ms, summary=min, colour="$text-accent", id="time-plot")
                table: DataTable[Text] = DataTable(id="timeline", cursor_type="row", zebra_stripes=True)
                for key, label, width in COLUMNS:
                    table.add_column(label, key=key, width=width)
                yield table
            with Vertical(id="review-right"):
                yield KernelView(cursor_blink=self.cursor_blink, id="review-kernel")
                yield MemoryPanel(review=True, id="review-memory")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#trend").border_title = "speedup · time over attempts"
        self.query_one("#timeline").border_title = "attempts"
        # After the first frame: started at once, the read and Textual's own start-up fight for the interpreter
        # lock, and both finish later than one after the other (measured: 2.5 s against 1.9 s for 100k events).
        self.call_after_refresh(self.load, self.root, self.session_id)

    @work(thread=True, exclusive=True, exit_on_error=False, group="review", description="session history")
    def load(self, root: Path, session_id: str) -> None:
        """Resolve the id and read the whole journal once (the slow part of opening a review)."""
        try:
            history = load_history(resolve_session_dir(root, session_id))
        except HistoryError as exc:
            self.post_message(self.Loaded(None, str(exc)))
            return
        self.post_message(self.Loaded(history))

    def on_review_screen_loaded(self, message: Loaded) -> None:
        header = self.query_one("#review-header", Static)
        if message.history is None:
            header.update(Content.assemble((f" {message.error}", "$text-error")))
            self.notify(message.error, severity="error", timeout=10)
            return
        history = self.history = message.history
        state = history.state
        self.index = {n: i for i, n in enumerate(history.order)}
        header.update(self._header())
        self.slots = any(a.slot for a in state.attempts.values())
        self.set_class(self.slots, "-slots")
        if self.slots:
            self.query_one("#timeline", DataTable).add_column("slot", key="slot", width=SLOT_WIDTH)
        attempts = [state.attempts[n] for n in history.order]
        self.query_one("#speed-plot", TrendPlot).set_values(
            [a.speedup if a.verdict == "ok" else None for a in attempts])
        self.query_one("#time-plot", TrendPlot).set_values([a.ms if a.verdict == "ok" else None for a in attempts])
        self.query_one("#timeline").border_subtitle = f"{len(attempts)} · ★ best · ◆ marked"
        self._add_rows(FIRST_ROWS)
        table = self.query_one("#timeline", DataTable)
        table.focus()
        if not attempts:
            self.query_one(MemoryPanel).show(state)
            self.query_one(KernelView).border_subtitle = "this session has no attempts"
        if self.rows_added < len(attempts):
            self.add_remaining_rows()

    def _header(self) -> Content:
        assert self.history is not None
        state = self.history.state
        best = state.best_attempt
        sep = (" │ ", "$foreground-muted")
        who = " · ".join(p for p in (state.model or state.agent, short_device(state.device) if state.device else "") if p)
        parts: list[str | tuple[str, str]] = [
            (" REVIEW ", "bold reverse $text-primary"), " ", (state.task or "?", "bold"),
            (f" · {who}" if who else "", "$foreground-muted"), sep, f"{len(state.attempts)} attempts", sep, "best ",
        ]
        parts += [(fmt.speedup(best.speedup), "bold $text-success"), (f" #{best.n}", "$foreground-muted")] \
            if best else [(fmt.DASH, "$foreground-muted")]
        parts += [sep, f"{state.tool_calls} tools", sep, fmt.duration(state.elapsed_at()), sep,
                  (state.status, "$text-warning" if state.status == "running" else ""), sep,
                  (self.history.id, "$foreground-muted")]
        return Content.assemble(*parts)

    def _cells(self, attempt: Attempt) -> list[Text]:
        assert self.history is not None
        state = self.history.state
        variables = self.app.theme_variables
        verdict_style = theme_style(variables, verdict_variable(attempt.verdict))
        tags = ("★" if attempt.n == state.best else "") + ("◆" if attempt.n == self.marked else "")
        human = "✎" if attempt.author == "human" else ""
        return [
            Text(f"{attempt.n}{human}{tags}", style=theme_style(variables, "text-primary", bold=bool(tags)),
                 justify="right"),
            Text(fmt.shorten(attempt.verdict or "pending", 10), style=verdict_style),
            Text(fmt.ms(attempt.ms), justify="right"),
            Text(fmt.speedup(attempt.speedup), justify="right", style=verdict_style if attempt.speedup else MUTED),
            Text(fmt.shorten(attempt_label(attempt, state.ledger, long=False), 80), style=MUTED if not attempt.note else ""),
        ] + ([Text(fmt.shorten(attempt.slot, SLOT_WIDTH) or fmt.DASH, style=MUTED)] if self.slots else [])

    def _add_rows(self, count: int) -> None:
        assert self.history is not None
        order = self.history.order
        table: DataTable[Text] = self.query_one("#timeline", DataTable)
        attempts = self.history.state.attempts
        end = min(len(order), self.rows_added + count)
        for n in order[self.rows_added:end]:
            table.add_row(*self._cells(attempts[n]), key=str(n))
        self.rows_added = end

    @work(exclusive=True, group="timeline", description="timeline rows")
    async def add_remaining_rows(self) -> None:
        """Add the rest of a long timeline in chunks on the event loop, yielding between them for keys."""
        assert self.history is not None
        while self.rows_added < len(self.history.order):
            await asyncio.sleep(0.01)
            self._add_rows(CHUNK_ROWS)

    @on(DataTable.RowHighlighted, "#timeline")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.select(int(event.row_key.value))

    def select(self, n: int) -> None:
        """Show attempt n: its kernel (in the current view), its point in the plots, the ledger after its step."""
        history = self.history
        if history is None or n not in history.state.attempts:
            return
        self.selected = n
        state = history.state
        self.query_one(KernelView).show(state.attempts[n], best=state.best, attempts=state.attempts)
        memory = self.query_one(MemoryPanel)
        memory.show(history.state_at(n))
        memory.border_title = f"nudges · ledger · memory as of attempt {n} (seq {history.steps[n].seq})"
        for plot in self.query(TrendPlot):
            plot.marker = self.index[n]

    def action_cycle_kernel_view(self) -> None:
        if self.selected is not None:
            self.query_one(KernelView).cycle_view()

    def action_mark(self) -> None:
        history, n = self.history, self.selected
        if history is None or n is None:
            return
        previous = self.marked
        self.marked = None if previous == n else n
        table: DataTable[Text] = self.query_one("#timeline", DataTable)
        for changed in {previous, self.marked} - {None}:
            assert changed is not None
            if self.index[changed] < self.rows_added:
                table.update_cell(str(changed), "n", self._cells(history.state.attempts[changed])[0])
        self.query_one(KernelView).compare_with(self.marked)
        if self.marked is not None:
            self.notify(f"Attempt {n} marked: select another attempt to see the diff from {n} to it.", timeout=4)

    def action_goto_best(self) -> None:
        history = self.history
        if history is None or history.state.best is None:
            self.notify("No attempt evaluated correct in this session.", severity="warning")
            return
        row = self.index[history.state.best]
        if row >= self.rows_added:
            self._add_rows(row + 1 - self.rows_added)
        self.query_one("#timeline", DataTable).move_cursor(row=row)

    def action_list_events(self) -> None:
        history, n = self.history, self.selected
        if history is None or n is None:
            return
        first, last = history.step_range(n)
        self.read_step(history.folder, n, first, last)

    @work(thread=True, exclusive=True, exit_on_error=False, group="review-events", description="step events")
    def read_step(self, folder: Path, n: int, first: int, last: int) -> None:
        """Read one step's events from the journal for the event list."""
        try:
            self.post_message(self.StepEvents(n, read_range(folder, first, last)))
        except HistoryError as exc:
            self.post_message(self.StepEvents(n, [], str(exc)))

    def on_review_screen_step_events(self, message: StepEvents) -> None:
        if message.error:
            self.notify(message.error, severity="error")
            return
        first = message.events[0]["seq"] if message.events else "?"
        last = message.events[-1]["seq"] if message.events else "?"
        self.app.push_screen(EventListScreen(message.events, title=f"attempt {message.n}: seq {first}–{last}"))

    def action_export(self) -> None:
        if self.history is not None:
            self.export(self.history)

    @work(thread=True, exclusive=True, exit_on_error=False, group="export", description="report export")
    def export(self, history: SessionHistory) -> None:
        """Write report.md (rendering a long session and the atomic write both stay off the event loop)."""
        from workbench.ui.report import write_report

        try:
            self.post_message(self.Exported(write_report(history)))
        except OSError as exc:
            self.post_message(self.Exported(None, f"report not written: {exc.strerror or exc}"))

    def on_review_screen_exported(self, message: Exported) -> None:
        if message.path is None:
            self.notify(message.error, severity="error")
        else:
            self.notify(f"Report written to {message.path}", title="export", timeout=6)

    def action_back(self) -> None:
        self.app.pop_screen()
