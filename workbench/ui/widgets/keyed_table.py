"""KeyedTable: a read-only table of Rich Text cells on the line API, changed by row key, each row drawn once per
content, layout and style.

It is the live screen's tables (evaluation, fleet, profile) rather than Textual's DataTable, for the key-to-paint of a
busy run: a DataTable keys its render caches by an update count, so after a change of one cell it renders every cell
through Rich again (4-5 ms of the main thread for the evaluation table or the fleet's, in the tick frames a key
waits behind). Here a row is a strip kept until its cells, the column widths, its style (zebra stripe, theme,
focus) or the window change, and an update repaints only the lines of the rows that changed or moved. The look is
DataTable's with `cursor_type="none"` and zebra stripes: a bold header row that stays put while the rows scroll under
it, one cell of padding either side of each column, each cell justified as its Text says and cut at its column's
width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.color import Color
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

PADDING = 1
"""Blank cells either side of each column, as DataTable's default cell_padding."""


@dataclass(frozen=True)
class Column:
    """One column: its key (what callers name it by), its header label, and a fixed content width, if any."""

    key: str
    label: str
    width: int | None = None
    """Cells of content (padding not counted); None: as wide as the widest label or value seen so far."""


@dataclass(frozen=True)
class _Look:
    """The styles of one render, read from the component classes once per render_lines, not once per line."""

    base: Style
    header: Style
    even: Style
    odd: Style
    background: Color
    """The widget's own background, which the space right of the last column fades towards."""


def same_cell(a: Text, b: Text) -> bool:
    """Whether two cells draw the same. Text's == compares the characters and spans only, so a cell that changed
    colour (a theme change, a time no longer the best) would keep its old look."""
    return a.plain == b.plain and a.style == b.style and a.justify == b.justify and a.spans == b.spans


class KeyedTable(ScrollView, can_focus=True):
    """Rows of Text cells by key, in the order sync_rows gives; columns widen for a longer value, never narrow."""

    COMPONENT_CLASSES = {"keyed-table--header", "keyed-table--even-row", "keyed-table--odd-row"}
    """The header row and the zebra stripes (rows counted from 0), as DataTable's datatable--* classes."""

    DEFAULT_CSS = """
    KeyedTable {
        background: $surface;
        color: $foreground;
        height: auto;
        max-height: 100%;
        &:focus {
            background-tint: $foreground 5%;
            & > .keyed-table--header { background-tint: $foreground 5%; }
        }
        &:dark > .keyed-table--even-row { background: $surface-darken-1 40%; }
        & > .keyed-table--header { text-style: bold; background: $panel; color: $foreground; }
        &:ansi > .keyed-table--header { background: ansi_bright_blue; color: ansi_default; }
        & > .keyed-table--even-row { background: $surface-lighten-1 50%; }
    }
    """

    def __init__(self, *columns: Column, id: str | None = None) -> None:
        super().__init__(id=id)
        self._columns: dict[str, Column] = {}
        self._widths: dict[str, int] = {}
        """Each column's content width now: its fixed width, or the widest label or value it has held."""
        self._layout: tuple[int, ...] = ()
        """The widths in column order: part of every cached strip's key."""
        self._rows: dict[str, tuple[Text, ...]] = {}
        """Row key -> cells in column order, in display order. A row's tuple is replaced only when a cell changes,
        so its identity says whether its strip is still good."""
        self._order: list[str] = []
        """The row keys in display order (render_line looks rows up by index)."""
        self._strips: dict[str, tuple[tuple[Text, ...], tuple[object, ...], Strip]] = {}
        """Row key -> (the cells, the rest of the key, the strip drawn for them); emptied when the style changes."""
        self._header: tuple[tuple[object, ...], Strip] | None = None
        """The header's key and strip."""
        self._look: _Look | None = None
        """The styles while render_lines runs."""
        self.set_columns(columns)

    @property
    def columns(self) -> Mapping[str, Column]:
        """The columns by key, in order (read only)."""
        return self._columns

    @property
    def rows(self) -> Mapping[str, tuple[Text, ...]]:
        """The rows by key, in display order: each row's cells in column order (read only)."""
        return self._rows

    @property
    def row_count(self) -> int:
        """How many rows the table holds."""
        return len(self._rows)

    def get_cell(self, row: str, column: str) -> Text:
        """The cell of row key `row` in column key `column`."""
        return self._rows[row][list(self._columns).index(column)]

    def content_width(self, column: str) -> int:
        """Cells of content column `column` has now (padding not counted)."""
        return self._widths[column]

    def set_columns(self, columns: Sequence[Column]) -> None:
        """Lay the table out with `columns` (and no rows): widths start from the labels again."""
        self._columns = {column.key: column for column in columns}
        self._widths = {c.key: c.width if c.width is not None else Text(c.label).cell_len for c in columns}
        self._rows, self._order = {}, []
        self._resize()
        self.refresh()

    def sync_rows(self, rows: Mapping[str, Sequence[Text]]) -> None:
        """Make the table hold exactly `rows` (row key -> cells in column order), in their order, repainting only the
        lines of rows that changed or moved.

        A longer value widens its column (and the table is drawn again); a shorter one leaves it as it is, so the
        table's width does not swing between evaluations (each change of it is a layout of the screen).
        """
        old = self._rows
        new: dict[str, tuple[Text, ...]] = {}
        for key, cells in rows.items():
            kept = old.get(key)
            same = kept is not None and len(kept) == len(cells) and all(map(same_cell, kept, cells))
            new[key] = kept if same and kept is not None else tuple(cells)
        before = self._order
        self._rows, self._order = new, list(new)
        for key in [key for key in self._strips if key not in new]:
            del self._strips[key]
        for column, *cells in zip(self._columns.values(), *new.values()):
            widest = max((cell.cell_len for cell in cells), default=0)
            if column.width is None and widest > self._widths[column.key]:
                self._widths[column.key] = widest
        if self._resize():  # a wider column or a row more or fewer: the whole table is drawn again
            self.refresh()
            return
        for index, (key, cells) in enumerate(new.items()):
            if index >= len(before) or before[index] != key or old[key] is not cells:
                self._refresh_row(index)
        for index in range(len(new), len(before)):
            self._refresh_row(index)

    def _refresh_row(self, index: int) -> None:
        """Mark the line showing row `index` dirty, if the window shows it (line 0 is the header)."""
        y = 1 + index - self.scroll_offset.y
        if 1 <= y < self.size.height:
            self.refresh(Region(0, y, self.size.width, 1))

    def _resize(self) -> bool:
        """Take the width of the columns and the number of rows as the virtual size; True if it changed."""
        self._layout = tuple(self._widths.values())
        size = Size(sum(self._layout) + 2 * PADDING * len(self._layout), 1 + len(self._rows))
        if size == self.virtual_size:
            return False
        self.virtual_size = size  # a layout: the table's height follows its rows
        return True

    def notify_style_update(self) -> None:
        """The style changed (theme, focus, CSS): the strips carry the old one."""
        super().notify_style_update()
        self._strips.clear()
        self._header = None

    def _read_look(self) -> _Look:
        style = self.get_component_rich_style
        return _Look(self.rich_style, style("keyed-table--header"), style("keyed-table--even-row"),
                     style("keyed-table--odd-row"), self.background_colors[1])

    def render_lines(self, crop: Region) -> list[Strip]:
        """Read the styles once for the lines of one render (each read walks the component classes)."""
        self._look = self._read_look()
        try:
            return super().render_lines(crop)
        finally:
            self._look = None

    def render_line(self, y: int) -> Strip:
        look = self._look or self._read_look()
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        window = (self._layout, scroll_x, width)
        if y == 0:
            key = (look.header, look.background, *window)
            if self._header is None or self._header[0] != key:
                labels = [Text(column.label) for column in self._columns.values()]
                self._header = key, self._render_row(labels, look.header, look.background, scroll_x, width)
            return self._header[1]
        index = y - 1 + scroll_y
        if index >= len(self._order):
            return Strip.blank(width, look.base)
        row = self._order[index]
        cells = self._rows[row]
        style = look.odd if index % 2 else look.even
        key = (style, look.background, *window)
        cached = self._strips.get(row)
        if cached is None or cached[0] is not cells or cached[1] != key:
            strip = self._render_row(cells, style, look.background, scroll_x, width)
            cached = self._strips[row] = (cells, key, strip)
        return cached[2]

    def _render_row(self, cells: Sequence[Text], style: Style, background: Color, scroll_x: int,
                    width: int) -> Strip:
        """One row as the window shows it: each cell padded, justified and cut to its column, then the space right of
        the last column in the row's colour faded towards the background (as DataTable draws it)."""
        console = self.app.console
        segments: list[Segment] = []
        pad = Segment(" " * PADDING, style)
        for cell, column_width in zip(cells, self._layout):
            text = cell
            if text.cell_len > column_width:
                text = cell.copy()
                text.truncate(column_width)
            room = column_width - text.cell_len
            left = room // 2 if text.justify == "center" else room if text.justify == "right" else 0
            segments += [pad, Segment(" " * left, style)]
            if text.spans:
                segments += [Segment(part, style + part_style if part_style else style)
                             for part, part_style, _control in text.render(console)]
            else:
                segments.append(Segment(text.plain, style + console.get_style(text.style, default=Style.null())))
            segments += [Segment(" " * (room - left), style), pad]
        table_width = sum(self._layout) + 2 * PADDING * len(self._layout)
        if style.bgcolor is not None:
            faded = Color.from_rich_color(style.bgcolor).blend(background, factor=0.25)
            extend = Style.from_color(style.color, faded.rich_color)
        else:
            extend = Style.from_color(style.color, style.bgcolor)
        segments.append(Segment(" " * max(0, width - table_width), extend))
        return Strip(segments).crop_extend(scroll_x, scroll_x + width, extend).simplify()
