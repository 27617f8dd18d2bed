"""EventListScreen and EventDetailScreen: pick one journal event from a list and read it whole."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Mapping, Sequence

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.highlight import highlight
from textual.widgets import DataTable, Label, Static

from workbench.ui import formatting as fmt
from workbench.ui.screens.dialog import Dialog

LIST_LIMIT = 1000
"""Newest events listed: enough to find anything recent."""

FIRST_ROWS = 60
"""Rows in the table before its first frame: more than a screenful."""

CHUNK_ROWS = 200
"""Rows added per step after that."""

DETAIL_SOURCE_KEYS = ("source",)
"""Data fields shown as code below the JSON instead of as one escaped string inside it."""


class EventListScreen(Dialog[None]):
    """The newest events passing a filter preset, newest first; Enter opens the selected one whole.

    The first rows are in the table when the screen first draws; the rest are added in chunks between key presses,
    since DataTable measures every cell it is given and a thousand rows at once would hold the screen for a second.
    """

    DEFAULT_CSS = """
    EventListScreen > #dialog { width: 116; padding: 0 1; }
    EventListScreen DataTable { height: 1fr; background: $surface; }
    EventListScreen #hint { color: $text-muted; height: 1; }
    """

    BINDINGS = [
        Binding("escape", "close", "Close", id="events.close", tooltip="Close the event list"),
        Binding("f", "cycle_filter", "Filter", id="events.filter",
                tooltip="All events, attempts and evaluations, tools, or nudges and errors"),
    ]

    def __init__(self, events: Sequence[Mapping[str, Any]], *, title: str, filter_key: str = "all") -> None:
        super().__init__(classes=self.TALL)
        self.events = list(events)
        """Every event this list may show, oldest first (already a bounded window)."""
        self.title_text = title
        """What the events are ('recent events', 'attempt 7: seq 80-97')."""
        self.filter = filter_key
        """The preset in force."""
        self.shown: list[Mapping[str, Any]] = []
        """The events the table holds or is being filled with, newest first; row i is shown[i]."""
        self.rows_added = 0
        """Rows in the table so far."""
        self.matching = 0
        """Events passing the filter, of which the newest LIST_LIMIT are listed."""
        self.table: DataTable[Text] = DataTable(id="event-table", cursor_type="row", zebra_stripes=True)
        """The list; built here so compose can fill its first rows before the first frame."""
        self.table.add_column("seq", key="seq", width=7)
        self.table.add_column("time", key="time", width=8)
        self.table.add_column("type", key="type", width=fmt.TYPE_WIDTH)
        self.table.add_column("what it says", key="summary", width=70)
        self.dialog = Vertical(id="dialog")
        """The frame whose border names the list; replaced by the one compose yields."""

    def compose(self) -> ComposeResult:
        self._select()
        with Vertical(id="dialog") as self.dialog:
            yield self.table
            yield Label("↑↓ move · Enter opens the event · f filter · Esc closes", id="hint")

    def on_mount(self) -> None:
        self._describe()
        self.table.focus()
        if self.rows_added < len(self.shown):
            self.add_remaining_rows()

    def _select(self) -> None:
        """Choose the events for the current filter and put the first rows in the (cleared) table."""
        matching = [e for e in self.events if fmt.passes(self.filter, e)]
        self.matching = len(matching)
        self.shown = matching[-LIST_LIMIT:][::-1]
        self.table.clear()
        self.rows_added = 0
        self._add_rows(FIRST_ROWS)

    def _add_rows(self, count: int) -> None:
        end = min(len(self.shown), self.rows_added + count)
        # Text cells with fixed column widths: a str would be parsed as markup, and journal text is free text.
        self.table.add_rows(
            (Text(str(e.get("seq", "?")), justify="right"), Text(fmt.clock(str(e.get("ts", ""))), style="dim"),
             Text(str(e.get("type", "?"))),
             Text(fmt.shorten(fmt.event_summary(str(e.get("type", "")), e.get("data") or {}), 200)))
            for e in self.shown[self.rows_added:end]
        )
        self.rows_added = end

    @work(exclusive=True, group="event-rows", description="event list rows")
    async def add_remaining_rows(self) -> None:
        """Add the older rows in chunks on the event loop, yielding between them so keys are handled."""
        while self.rows_added < len(self.shown):
            await asyncio.sleep(0.01)
            self._add_rows(CHUNK_ROWS)
        self._describe()

    def _describe(self) -> None:
        dialog = self.dialog
        dialog.border_title = f"{self.title_text} · filter: {fmt.filter_label(self.filter)} · newest first"
        count = len(self.shown)
        dialog.border_subtitle = f"newest {count} of {self.matching}" if self.matching > count else f"{count} events"

    def selected(self) -> Mapping[str, Any] | None:
        """The event under the cursor, or None when the list is empty."""
        row = self.table.cursor_row
        return self.shown[row] if self.table.row_count and 0 <= row < self.rows_added else None

    @on(DataTable.RowSelected)
    def _open(self, event: DataTable.RowSelected) -> None:
        record = self.selected()
        if record is not None:
            self.app.push_screen(EventDetailScreen(record))

    def action_cycle_filter(self) -> None:
        self.filter = fmt.next_filter(self.filter)
        self._select()
        self._describe()
        if self.rows_added < len(self.shown):
            self.add_remaining_rows()

    def action_close(self) -> None:
        self.dismiss(None)


def detail_text(event: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
    """The event as indented JSON, with long code fields taken out (they follow as code, not as escaped strings).

    Returns:
        (JSON text, {field: code} for the fields taken out).
    """
    data = dict(event.get("data") or {})
    code = {k: data[k] for k in DETAIL_SOURCE_KEYS if isinstance(data.get(k), str) and "\n" in data[k]}
    for key, text in code.items():
        data[key] = f"<{len(text)} characters, shown below>"
    shown = {**event, "data": data}
    return json.dumps(shown, indent=2, ensure_ascii=False, default=str), code


class EventDetailScreen(Dialog[None]):
    """One event, pretty-printed: the JSON of its journal line, and any kernel source in it as Python."""

    DEFAULT_CSS = """
    EventDetailScreen > #dialog { width: 110; padding: 0; }
    EventDetailScreen VerticalScroll { height: 1fr; background: $surface; }
    EventDetailScreen Static { width: 1fr; padding: 0 1; }
    EventDetailScreen .code-title { color: $text-primary; text-style: bold; margin-top: 1; }
    """

    BINDINGS = [Binding("escape", "close", "Close", id="event.close", tooltip="Back to the list")]

    def __init__(self, event: Mapping[str, Any]) -> None:
        super().__init__(classes=self.TALL)
        self.event = event
        """The journal record shown."""

    def compose(self) -> ComposeResult:
        text, code = detail_text(self.event)
        with Vertical(id="dialog") as dialog:
            dialog.border_title = (f"event {self.event.get('seq', '?')} · {self.event.get('type', '?')} · "
                                   f"{self.event.get('ts', '')}")
            dialog.border_subtitle = "↑↓ PgUp PgDn scroll · Esc closes"
            with VerticalScroll():
                yield Static(id="event-json")
                for key in code:
                    yield Static(Content(f"data.{key}"), classes="code-title")
                    yield Static(id=f"event-code-{key}", classes="event-code")
        self._text, self._code = text, code

    def on_mount(self) -> None:
        self._render_text()
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._render_text())
        self.query_one(VerticalScroll).focus()

    def _render_text(self) -> None:
        self.query_one("#event-json", Static).update(highlight(self._text, language="json"))
        for key, code in self._code.items():
            self.query_one(f"#event-code-{key}", Static).update(highlight(code, language="python"))

    def action_close(self) -> None:
        self.dismiss(None)
