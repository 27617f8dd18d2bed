"""TrendPlot: one series over attempts drawn with braille dots (2x4 per cell), with the selected attempt marked.

textual-plotext is not a dependency, and a sparkline has no axis; this is the small plot review needs.
"""

from __future__ import annotations

from typing import Callable, Sequence

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

AXIS = 8
"""Columns for the value labels left of the plot."""

_DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
"""Braille dot bits by (row within the cell, column within the cell)."""


def plot_columns(
    values: Sequence[float | None], width: int, summary: Callable[[list[float]], float]
) -> list[float | None]:
    """Spread or bucket `values` over `width` dot columns: short series are stretched, long ones summarised.

    Args:
        values: one value per attempt; None marks an attempt without a value (a gap in the line).
        width: dot columns available.
        summary: how a bucket of several attempts becomes one value (max for speedup, min for time).
    """
    n = len(values)
    if n == 0 or width <= 0:
        return []
    if n <= width:
        columns: list[float | None] = [None] * width
        for i, value in enumerate(values):
            columns[round(i * (width - 1) / max(1, n - 1)) if n > 1 else 0] = value
        return columns
    out: list[float | None] = []
    for x in range(width):
        chunk = [v for v in values[x * n // width:(x + 1) * n // width] if v is not None]
        out.append(summary(chunk) if chunk else None)
    return out


def column_of(index: int, count: int, width: int) -> int:
    """The dot column attempt `index` (0-based, of `count`) lands in; the inverse of plot_columns' layout."""
    if count <= 1:
        return 0
    if count <= width:
        return round(index * (width - 1) / (count - 1))
    return min(width - 1, index * width // count)


class TrendPlot(Widget):
    """A line over attempts; failed attempts are gaps. The value range is printed on the left."""

    DEFAULT_CSS = """
    TrendPlot { height: 4; }
    """

    marker: reactive[int | None] = reactive(None)
    """Index (into the values) of the selected attempt, drawn as a highlighted column."""

    def __init__(
        self,
        label: str,
        *,
        value_format: Callable[[float], str],
        summary: Callable[[list[float]], float] = max,
        colour: str = "$text-success",
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        self.label = label
        """Printed in the axis between the maximum and the minimum (e.g. 'speedup')."""
        self.value_format = value_format
        """Formats the axis labels."""
        self.summary = summary
        """Combines attempts that share a dot column."""
        self.colour = colour
        """Theme variable the line is drawn in."""
        self.values: list[float | None] = []
        """One value per attempt, in attempt order."""

    def set_values(self, values: Sequence[float | None]) -> None:
        """Replace the series and redraw."""
        self.values = list(values)
        self.refresh()

    def render(self) -> Content:
        width, height = self.size.width - AXIS, max(1, self.size.height)
        finite = [v for v in self.values if v is not None]
        if width < 4 or not finite:
            return Content.assemble((f"{self.label}: no values yet", "$text-muted"))
        low, high = min(finite), max(finite)
        if high == low:
            low, high = low - 0.5 * abs(low or 1), high + 0.5 * abs(high or 1)
        dots_x, dots_y = width * 2, height * 4
        columns = plot_columns(self.values, dots_x, self.summary)
        cells = [[0] * width for _ in range(height)]

        def dot(x: int, y: int) -> None:
            row = dots_y - 1 - y  # y counts up from the bottom
            cells[row // 4][x // 2] |= _DOTS[row % 4][x % 2]

        def level(value: float) -> int:
            return round((value - low) / (high - low) * (dots_y - 1))

        previous: tuple[int, int] | None = None
        for x, value in enumerate(columns):
            if value is None:
                # A stretched short series leaves empty columns between attempts: the line bridges them, but an
                # attempt without a value (a failure) breaks it.
                continue
            y = level(value)
            if previous is not None and self._connected(previous[0], x):
                x0, y0 = previous
                for xi in range(x0 + 1, x + 1):
                    yi = round(y0 + (y - y0) * (xi - x0) / (x - x0))
                    yp = round(y0 + (y - y0) * (xi - 1 - x0) / (x - x0))
                    for yy in range(min(yi, yp), max(yi, yp) + 1):
                        dot(xi, yy)
            dot(x, y)
            previous = (x, y)
        marked = column_of(self.marker, len(self.values), dots_x) // 2 if self.marker is not None else None
        labels = {0: self.value_format(high), height - 1: self.value_format(low)}
        if height > 2:
            labels.setdefault(height // 2, self.label)
        lines: list[Content] = []
        for r, row in enumerate(cells):
            parts: list[str | tuple[str, str]] = [(f"{labels.get(r, ''):>{AXIS - 1}} ", "$text-muted")]
            text = "".join(chr(0x2800 + bits) for bits in row)
            if marked is None:
                parts.append((text, self.colour))
            else:
                parts += [(text[:marked], self.colour), (text[marked], f"reverse {self.colour}"),
                          (text[marked + 1:], self.colour)]
            lines.append(Content.assemble(*parts))
        return Content("\n").join(lines)

    def _connected(self, x0: int, x1: int) -> bool:
        """Whether two drawn columns are neighbours in the data (no failed attempt between them)."""
        n = len(self.values)
        dots_x = (self.size.width - AXIS) * 2
        if n > dots_x:
            return x1 - x0 == 1
        # Stretched: find the attempts behind the two columns and check none between them lacks a value.
        i0 = round(x0 * (n - 1) / max(1, dots_x - 1))
        i1 = round(x1 * (n - 1) / max(1, dots_x - 1))
        return i1 - i0 <= 1
