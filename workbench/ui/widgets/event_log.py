"""EventLog: one line per journal event in a capped Log, coloured by event type, filtered by preset."""

from __future__ import annotations

import re
from collections import deque
from typing import Any, Mapping, Sequence

from rich.highlighter import Highlighter
from rich.style import Style
from rich.text import Text
from textual.widgets import Log

from workbench.ui.formatting import event_line, filter_label, filter_types
from workbench.ui.palette import MUTED, theme_style
from workbench.ui.widgets.pane import pane_css

_TYPE_VARIABLE = {
    "error": "text-error",
    "run.stopped": "text-warning",
    "run.paused": "text-warning",
    "run.resumed": "text-success",
    "run.started": "text-success",
    "nudge.received": "text-accent",
    "nudge.acked": "text-accent",
    "eval.finished": "text-primary",
    "attempt.written": "text-primary",
    "ledger.updated": "text-secondary",
    "memory.compacted": "text-secondary",
    "profile.finished": "text-secondary",
}
"""Event types that stand out; the rest (tool calls, checkpoints, llm traffic) stay in the plain colour."""

# The layout event_line() writes: 'HH:MM:SS  seq type              summary'.
_LINE = re.compile(r"^(\S+ +\d+) (\S+)")
_VERDICT = re.compile(r"attempt \d+: (ok|\w+)")
_FAILED = re.compile(r" (FAILED|ABORTED): ")


class EventHighlighter(Highlighter):
    """Colours the time/seq prefix, the event type and an evaluation's verdict with theme colours."""

    def __init__(self) -> None:
        self.styles: dict[str, Style] = {}
        """Theme variable -> style, rebuilt by EventLog when the theme changes."""

    def highlight(self, text: Text) -> None:
        head = _LINE.match(text.plain)
        if head is None:
            return
        text.stylize(MUTED, 0, head.end(1))
        kind = head.group(2)
        variable = _TYPE_VARIABLE.get(kind)
        if variable:
            text.stylize(self.styles.get(variable, Style()), head.start(2), head.end(2))
        if kind in ("eval.finished", "tool.result"):
            verdict = _VERDICT.search(text.plain, head.end())
            if verdict:
                good = verdict.group(1) == "ok"
                style = self.styles.get("text-success" if good else "text-error", Style())
                text.stylize(style, verdict.start(1), verdict.end(1))
            failed = _FAILED.search(text.plain, head.end())
            if failed:
                text.stylize(self.styles.get("text-error", Style()), failed.start(1), failed.end(1))


class EventLog(Log):
    """The live event log: a window onto events.jsonl, capped at max_lines, fed in batches, filtered by preset."""

    DEFAULT_CSS = pane_css("EventLog", ":focus") + """
    EventLog { scrollbar-size-vertical: 1; }
    """

    def __init__(self, *, max_lines: int, id: str | None = None) -> None:
        super().__init__(highlight=True, max_lines=max_lines, id=id)
        self.highlighter = EventHighlighter()
        self.events_written = 0
        """Events received so far, shown or not (the Log itself keeps only the newest max_lines)."""
        self.filter = "all"
        """The preset in force (a key of formatting.EVENT_FILTERS)."""
        self.formatted: deque[tuple[str, str]] = deque(maxlen=max(1, max_lines))
        """(type, line) of the newest events, shown or not: a new filter redraws from these without formatting."""

    def on_mount(self) -> None:
        self._describe()
        self._restyle()
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._restyle())

    def _restyle(self) -> None:
        assert isinstance(self.highlighter, EventHighlighter)
        variables = self.app.theme_variables
        self.highlighter.styles = {name: theme_style(variables, name) for name in set(_TYPE_VARIABLE.values()) |
                                   {"text-success", "text-error"}}
        # Log caches rendered lines; drop them so the new colours show.
        self.notify_style_update()
        self.refresh()

    def _describe(self) -> None:
        shown = "" if self.filter == "all" else f" · filter: {filter_label(self.filter)} (f)"
        self.border_title = f"events{shown}"
        self.border_subtitle = f"{self.events_written} events · newest {self.max_lines or 'all'} kept"

    def write_events(self, events: Sequence[Mapping[str, Any]]) -> None:
        """Append one batch of journal records with a single write (follows the tail only at the bottom)."""
        if not events:
            return
        self.events_written += len(events)
        batch = [(str(e.get("type", "")), event_line(e)) for e in events]
        self.formatted.extend(batch)
        types = filter_types(self.filter)
        lines = [line for kind, line in batch if types is None or kind in types]
        if lines:
            self.write_lines(lines)
        self._describe()

    def set_filter(self, key: str) -> None:
        """Switch preset and redraw the kept lines that pass it: one rewrite on a key press, never per event."""
        self.filter = key
        self.clear()
        types = filter_types(key)
        self.write_lines([line for kind, line in self.formatted if types is None or kind in types])
        self._describe()
