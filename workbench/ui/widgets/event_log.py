"""EventLog: one line per journal event in a capped scrolling view, coloured by event type, filtered by preset.

It is a line-API ScrollView of its own rather than Textual's Log, for the key-to-paint of a busy run: Log renders
every visible line again on each frame (its strip cache is only kept while text is selected) and measures the width
of each batch in a worker thread that changes the virtual size a second time, which is a second layout of the whole
screen. Here a line is rendered once per style (cached by its text, so a new filter redraws lines already drawn),
widths are measured once as lines are formatted, and a batch or a filter changes the virtual size once.

Its rows skip Textual's per-line styles pipeline too (a RowFrame, learned from one row Textual draws, puts the kept
strips in their borders), and each preset's newest lines are drawn as they arrive, so a filter key draws nothing new.
"""

from __future__ import annotations

import re
from math import ceil
from typing import Any, Mapping, Sequence, cast

from rich.cells import cell_len
from rich.highlighter import Highlighter
from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.scrollbar import ScrollBar, ScrollBarRender
from textual.selection import Selection
from textual.strip import Strip

from workbench.ui.formatting import EVENT_FILTERS, event_line, filter_label
from workbench.ui.palette import MUTED, theme_style
from workbench.ui.row_frame import RowFrame, edge_key, frame_key, learn_frame
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
_CONTROL = re.compile("[\u0000-\u001f]")
"""Control characters (newlines and tabs included) are shown as one replacement character: one event, one line."""

BAR_CACHE = 32
"""Scrollbar drawings kept: every filter's thumb at the bottom and a few scrolled positions."""
STRIP_CACHE = 1024
"""Rendered lines kept (by text and window): several screens of every filter, so cycling the filter renders nothing
new."""


EDGE_CACHE = 8
"""Border rows kept: the top row for each filter's title and the bottom row for the latest counts."""


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


class LogScrollBar(ScrollBar):
    """The log's vertical scrollbar, its drawn lines kept for each thumb it has shown.

    The filter key switches among views of different lengths, so each press moves the thumb, and redrawing a bar
    through Rich and the styles pipeline took 0.5 ms of a 1.3 ms key frame. A drawing depends on the crop, the bar's
    height, where the thumb starts and ends (in the eighths of a cell ScrollBarRender draws), the style
    ScrollBar.render chose (theme, focus, hover, grab) and the theme's ANSI mode; that is the key. Views much longer
    than the window all draw the same one-cell thumb at the bottom, so a press usually finds its bar drawn already.
    """

    def __init__(self, thickness: int) -> None:
        super().__init__(vertical=True, name="vertical", thickness=thickness)
        self._drawn: LRUCache[tuple[Any, ...], list[Strip]] = LRUCache(BAR_CACHE)

    def render_lines(self, crop: Region) -> list[Strip]:
        bar = cast(ScrollBarRender, self.render())
        key = (crop, self.size, thumb_eighths(self.size.height, bar), bar.style, self.app.theme, self.app.ansi_color)
        strips = self._drawn.get(key)
        if strips is None:
            strips = self._drawn[key] = super().render_lines(crop)
        return strips


def thumb_eighths(size: int, bar: ScrollBarRender) -> tuple[int, int] | None:
    """Where ScrollBarRender.render_bar draws the thumb of a bar `size` cells long: (start, end) in eighths of a
    cell, or None for a bar with no thumb (the same arithmetic as Textual 8.2.8's)."""
    virtual, window, position = bar.virtual_size, bar.window_size, bar.position
    if not (window and size and virtual and size != virtual):
        return None
    eighths = len(ScrollBarRender.VERTICAL_BARS)
    thumb = max(1, window / (virtual / size))
    start = int((size - thumb) * (position / (virtual - window)) * eighths)
    return start, start + ceil(thumb * eighths)


class EventLog(ScrollView, can_focus=True):
    """The live event log: a window onto events.jsonl, capped at max_lines, fed in batches, filtered by preset."""

    ALLOW_SELECT = True
    DEFAULT_CSS = pane_css("EventLog", ":focus") + """
    EventLog {
        color: $text;
        overflow: scroll;
        scrollbar-size-vertical: 1;
        &:focus { background-tint: $foreground 5%; }
    }
    """

    def __init__(self, *, max_lines: int, id: str | None = None) -> None:
        super().__init__(id=id)
        self.max_lines = max(1, max_lines)
        """Most lines shown; older ones leave the top."""
        self.highlighter = EventHighlighter()
        self.events_written = 0
        """Events received so far, shown or not (the view itself keeps only the newest max_lines)."""
        self.filter = "all"
        """The preset in force (a key of formatting.EVENT_FILTERS)."""
        self._views: dict[str, list[str]] = {key: [] for key, _label, _types in EVENT_FILTERS}
        """Each preset's lines, oldest first, its newest max_lines: kept as events arrive, so a filter key switches
        to a list instead of filtering every kept event again."""
        self._lines: list[str] = self._views[self.filter]
        """The lines shown: the current preset's view."""
        self._width = 0
        """Cells of the widest event received, shown or not: the virtual width (the view scrolls sideways). It does not
        change with the filter, so a filter key leaves the horizontal scrollbar as it is."""
        self._strips: LRUCache[tuple[str, int, int, Style], Strip] = LRUCache(STRIP_CACHE)
        """(line text, scroll x, width, style) -> its strip as shown; emptied when the style changes (the highlighter's
        theme colours are not in the key)."""
        self._line_style: Style | None = None
        """The widget's style while render_lines runs (render_line reads it instead of walking the DOM per line)."""
        self._frame: RowFrame | None = None
        """How Textual's styles pipeline draws a content row in the current styles (learned by _row_frame)."""
        self._rows: LRUCache[tuple[str | None, int, int, Style, int], Strip] = LRUCache(STRIP_CACHE)
        """(line text or None for a blank row, scroll x, width, style, line index) -> the row as the frame draws it
        (filtered, offsets applied, in its borders); emptied with a new frame or a style change."""
        self._edges: LRUCache[tuple[Any, ...], Strip] = LRUCache(EDGE_CACHE)
        """(border row, its edge_key) -> the row as Textual drew it; emptied with a new frame or a style change."""

    @property
    def vertical_scrollbar(self) -> ScrollBar:
        """Widget.vertical_scrollbar with a LogScrollBar (Textual 8.2.8 makes its own there; the version is pinned)."""
        if self._vertical_scrollbar is None:
            self._vertical_scrollbar = bar = LogScrollBar(self.scrollbar_size_vertical)
            bar.display = False
            self.app._start_widget(self, bar)
        return self._vertical_scrollbar

    @property
    def lines(self) -> Sequence[str]:
        """The lines shown, oldest first (read only)."""
        return self._lines

    @property
    def line_count(self) -> int:
        return len(self._lines)

    def on_mount(self) -> None:
        self._describe()
        self._restyle()
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._restyle())

    def _restyle(self) -> None:
        variables = self.app.theme_variables
        self.highlighter.styles = {name: theme_style(variables, name) for name in set(_TYPE_VARIABLE.values()) |
                                   {"text-success", "text-error"}}
        self.notify_style_update()
        self.refresh()

    def notify_style_update(self) -> None:
        """The style changed (theme, focus): the cached lines carry the old one."""
        super().notify_style_update()
        self._strips.clear()
        self._rows.clear()
        self._edges.clear()

    def _describe(self) -> None:
        shown = "" if self.filter == "all" else f" · filter: {filter_label(self.filter)} (f)"
        self.border_title = f"events{shown}"
        self.border_subtitle = f"{self.events_written} events · newest {self.max_lines} kept"

    def write_events(self, events: Sequence[Mapping[str, Any]]) -> None:
        """Append one batch of journal records with a single write (follows the tail only at the bottom)."""
        if not events:
            return
        follow = self.is_vertical_scroll_end and not self.is_vertical_scrollbar_grabbed
        if self._append(events):
            self._resize(follow)
        self._describe()
        self._draw_ahead()

    def _draw_ahead(self) -> None:
        """Draw each other preset's newest window now, as its events arrive, so that a filter key finds its rows drawn.

        The key's frame otherwise drew every line new to the window it switched to through Rich (40 us a line headless,
        about 90 in tmux under load). What is drawn here is what the frame would draw, under the same keys, so it is
        kept only while the learned frame still holds and no text is selected; a line already drawn costs a lookup.
        """
        frame = self._frame
        if frame is None or not frame.matches or self.text_selection is not None or frame_key(self) != frame.key:
            return
        style, scroll_x, width, height = self.rich_style, self.scroll_offset.x, self.size.width, len(frame.rows)
        for view in self._views.values():
            if view is not self._lines:
                for index in range(max(0, len(view) - height), len(view)):
                    self._row(frame, style, view, scroll_x, index, width)

    def set_filter(self, key: str, events: Sequence[Mapping[str, Any]] = ()) -> None:
        """Append `events` (those not written yet), then switch preset: one rewrite on a key press, never per event."""
        self._append(events)
        self.filter = key
        self._lines = self._views[key]
        self._resize(follow=True)
        self._describe()

    def _append(self, events: Sequence[Mapping[str, Any]]) -> bool:
        """Format `events` into every preset's view; True if the one shown got lines."""
        if not events:
            return False
        self.events_written += len(events)
        batch = []
        for event in events:
            line = _CONTROL.sub("\ufffd", event_line(event))
            batch.append((str(event.get("type", "")), line))
            self._width = max(self._width, cell_len(line))
        shown = False
        for key, _label, types in EVENT_FILTERS:
            added = [line for kind, line in batch if types is None or kind in types]
            view = self._views[key]
            view.extend(added)
            if len(view) > self.max_lines:
                del view[:len(view) - self.max_lines]
            shown = shown or (bool(added) and key == self.filter)
        return shown

    def _resize(self, follow: bool) -> None:
        """Take the extent of the lines now held, and go to the newest line when `follow`.

        The pane's own size never depends on its lines, so a longer or shorter log needs no layout of the screen,
        which assigning `virtual_size` would do (a whole-screen reflow on every batch and every filter key). The
        value is set without its watchers and the two scrollbars, always shown (overflow: scroll), take the extent.
        """
        size = Size(self._width, len(self._lines))
        if size != self.virtual_size:
            self.set_reactive(EventLog.virtual_size, size)
            if self.show_vertical_scrollbar:
                self.vertical_scrollbar.window_virtual_size = size.height
            if self.show_horizontal_scrollbar:
                self.horizontal_scrollbar.window_virtual_size = size.width
        if follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        else:
            self.scroll_y = self.validate_scroll_y(self.scroll_y)
        self.refresh()

    def render_lines(self, crop: Region) -> list[Strip]:
        """The rows in `crop`: content rows put together from the kept strips through the learned RowFrame, border rows
        kept per title; Textual's path (StylesCache) when no frame applies (selected text, styles beyond borders).

        The widget's style is read once for the lines of one render, not once per line (it walks the ancestors)."""
        self._line_style = style = self.rich_style
        try:
            frame = self._row_frame(style)
            if frame is None:
                return super().render_lines(crop)
            rows, (scroll_x, scroll_y), width = frame.rows, self.scroll_offset, self.size.width
            top = scroll_y - rows.start
            strips = [self._row(frame, style, self._lines, scroll_x, top + y, width) if y in rows
                      else self._edge(frame, y) for y in crop.line_range]
            if crop.column_span != (0, frame.width):
                x1, x2 = crop.column_span
                strips = [strip.crop(x1, x2) for strip in strips]
            return strips
        finally:
            self._line_style = None

    def _row_frame(self, style: Style) -> RowFrame | None:
        """The frame for the current styles, learned from one row Textual draws when they change; None for Textual's
        path: text is selected (its styles are not kept), the styles need more than borders, or the frame did not
        reproduce Textual's row."""
        if self.text_selection is not None:
            return None
        key = frame_key(self)
        if key is None:
            return None
        frame = self._frame
        if frame is None or frame.key != key:
            top = self.styles.gutter.top
            if top >= self.region.height - self.styles.gutter.bottom:
                return None
            drawn = super().render_lines(Region(0, top, self.region.width, 1))[0]
            frame = self._frame = learn_frame(self, key, drawn, *self._content(0, style))
            self._rows.clear()
            self._edges.clear()
        return frame if frame.matches else None

    def _row(self, frame: RowFrame, style: Style, lines: list[str], scroll_x: int, index: int, width: int) -> Strip:
        """Line `index` of `lines` (or a blank row past the last) as the frame draws it, kept with the window and the
        style."""
        line = lines[index] if index < len(lines) else None
        key = (line, scroll_x, width, style, index)
        row = self._rows.get(key)
        if row is None:
            if line is None:
                row = frame.row(Strip.blank(width, style), None)
            else:
                row = frame.row(self._strip(lines, index, style, scroll_x, width), (scroll_x, index))
            self._rows[key] = row
        return row

    def _edge(self, frame: RowFrame, y: int) -> Strip:
        """Border row `y` as Textual draws it, kept per title (the top row) or subtitle (the bottom row) and its styles:
        a filter key changes only the title and a batch of events only the subtitle."""
        key = (y, edge_key(self, y < frame.rows.start))
        strip = self._edges.get(key)
        if strip is None:
            strip = self._edges[key] = super().render_lines(Region(0, y, frame.width, 1))[0]
        return strip

    def render_line(self, y: int) -> Strip:
        strip, offsets = self._content(y, self._line_style if self._line_style is not None else self.rich_style)
        return strip if offsets is None else strip.apply_offsets(*offsets)

    def _content(self, y: int, style: Style) -> tuple[Strip, tuple[int, int] | None]:
        """Content line `y` of the window, before the styles pipeline: its strip and the selection offsets (x, y) its
        segments get (none for the blank rows below the last line)."""
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        if index >= len(self._lines):
            return Strip.blank(width, style), None
        return self._strip(self._lines, index, style, scroll_x, width), (scroll_x, index)

    def _strip(self, lines: list[str], index: int, style: Style, scroll_x: int, width: int) -> Strip:
        """Line `index` of `lines` as the window shows it (from `scroll_x`, `width` cells); from the cache unless text
        is selected (selection styles are not kept). The crop is kept too: cropping a long line cost as much as the
        rest."""
        line = lines[index]
        selection = self.text_selection
        key = (line, scroll_x, width, style)
        if selection is None and (cached := self._strips.get(key)) is not None:
            return cached
        text = Text(line, no_wrap=True)
        text.stylize(style)
        self.highlighter.highlight(text)
        if selection is not None:
            span = selection.get_span(index)
            if span is not None:
                start, end = span
                text.stylize(self.screen.get_component_rich_style("screen--selection"), start,
                             len(text) if end == -1 else end)
        strip = Strip(text.render(self.app.console), cell_len(line)).crop_extend(scroll_x, scroll_x + width, style)
        if selection is None:
            self._strips[key] = strip
        return strip

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        """The selected text, for copying."""
        return selection.extract("\n".join(self._lines)), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self.refresh()
