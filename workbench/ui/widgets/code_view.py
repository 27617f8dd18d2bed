"""CodeView: a read-only code editor that takes its syntax highlights for the rows around the view only.

Textual's TextArea (8.2.8, pinned) rebuilds the highlights of the whole document on every edit, in Python over every
capture of its highlight query: 18.6 ms of main-thread CPU for kernels/kda/kda_chunked.py (489 lines), of the 26 ms
an edit takes, and the kernel pane is edited at every new attempt, while the person's keys wait on the same thread.
Here the query runs over a window of rows (the view and one view above and below, nodes that reach into it included)
and runs again when the view leaves the window (a scroll, a taller pane), before those rows are drawn. Only a new
document (load_text) is queried whole once, for the order in which TextArea applies the highlight names.
"""

from __future__ import annotations

from textual.geometry import Region
from textual.strip import Strip
from textual.widgets import TextArea


class CodeView(TextArea):
    """A TextArea whose highlights cover the rows near the view (see the module's docstring)."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - TextArea's own parameters
        self._window: range | None = None
        """The rows the highlights were taken for; None before the first query (and without a query)."""
        self._order: dict[str, int] = {}
        """_capture_order's names, for the document in _order_of."""
        self._order_of: object = None
        super().__init__(*args, **kwargs)

    def _build_highlight_map(self) -> None:
        """TextArea's highlight map, for the window of rows around the view: `_highlights[row]` holds (start column,
        end column or None for the line's end, highlight name) for each captured node on that row."""
        if self.soft_wrap:  # the view's rows are wrapped lines, not the document's: TextArea's whole map
            self._window = None
            super()._build_highlight_map()
            return
        self._line_cache.clear()
        highlights = self._highlights
        highlights.clear()
        if not self._highlight_query:
            self._window = None
            return
        top, height = self.scroll_offset.y, max(self.size.height, 1)
        window = self._window = range(max(0, top - height), top + 2 * height)
        captures = self.document.query_syntax_tree(self._highlight_query, start_point=(window.start, 0),
                                                   end_point=(window.stop, 0))
        # A token that two captures name takes the colour of the one applied last, and TextArea applies the names in
        # the order they first occur in the whole document: that order is taken once per document (one query over
        # all of it) and kept through its edits, so the window's rows get TextArea's colours. (An edit that moves a
        # name's first occurrence would reorder TextArea's; here the colours stay as they were.)
        order = self._capture_order()
        for name, nodes in sorted(captures.items(), key=lambda item: order.get(item[0], len(order))):
            for node in nodes:
                (first, start), (last, end) = node.start_point, node.end_point
                if first == last:
                    highlights[first].append((start, end, name))
                    continue
                highlights[first].append((start, None, name))
                for row in range(first + 1, last):
                    highlights[row].append((0, None, name))
                highlights[last].append((0, end, name))

    def _capture_order(self) -> dict[str, int]:
        """The highlight names in the order they first occur in the document, from one query over all of it when the
        document is new (load_text makes a new one; edits keep it). A name first seen later goes after them."""
        if self._order_of is not self.document:
            self._order = {name: i for i, name in enumerate(self.document.query_syntax_tree(self._highlight_query))}
            self._order_of = self.document
        return self._order

    def render_lines(self, crop: Region) -> list[Strip]:
        window, top = self._window, self.scroll_offset.y
        if window is not None and (top < window.start or top + self.size.height > window.stop):
            self._build_highlight_map()
        return super().render_lines(crop)
