"""CodeView: a read-only code editor that takes its syntax highlights for the rows around the view only.

Textual's TextArea (8.2.8, pinned) rebuilds the highlights of the whole document on every edit, in Python over every
capture of its highlight query: 18.6 ms of main-thread CPU for kernels/kda/kda_chunked.py (489 lines), of the 26 ms
an edit takes, and the kernel pane is edited at every new attempt, while the person's keys wait on the same thread.
Here the query runs over a window of rows (the view and one view above and below, nodes that reach into it included)
and runs again when the view leaves the window (a scroll, a taller pane), before those rows are drawn. Only a new
document (load_text) is queried whole once, for the order in which TextArea applies the highlight names, and again
after an edit that reaches a name's first capture or brings one above it (which can reorder them). After an
edit, only the rows it can change are queried again: its own and those whose syntax tree-sitter says changed (a tuner's
attempt changes one line: 1.4 ms of main-thread CPU for the 79-line softmax seed's window before, a fraction now).

It also repaints only the rows that change. TextArea repaints the whole view whenever its selection is set, and an edit
sets it: a new attempt that changes one line of the kernel redrew every visible row (about 4 ms of a frame on a 2-core
box, 170 us a row). Here each drawn row keeps a key of what it shows (its line, highlights, selection and cursor), and
after an edit or a selection change only the rows whose key changed are repainted; anything that changes every row
(a scroll, a resize, the gutter, the widest line, focus, theme) repaints the whole view as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.document._document import EditResult
from textual.document._edit import Edit
from textual.document._syntax_aware_document import SyntaxAwareDocument
from textual.geometry import Region
from textual.reactive import reactive
from textual.strip import Strip
from textual.widgets import TextArea
from textual.widgets.text_area import Selection

if TYPE_CHECKING:
    from tree_sitter import Tree


def _span(node: Any) -> tuple[int, int]:
    return node.start_byte, node.end_byte


class CodeView(TextArea):
    """A TextArea whose highlights cover the rows near the view and whose repaints cover the rows that changed (see
    the module's docstring)."""

    selection = reactive(Selection(), init=False, always_update=True, repaint=False)
    """TextArea's selection, but a change repaints only the rows it changes (_repaint_changed_rows)."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - TextArea's own parameters
        self._drawn: dict[int, tuple[Any, ...]] = {}
        """View row -> the key (_row_keys) of what it was last drawn from."""
        self._drawn_view: tuple[Any, ...] | None = None
        """The view key (_view_key) the rows in _drawn were drawn under."""
        self._window: range | None = None
        """The rows the highlights were taken for; None before the first query (and without a query)."""
        self._order: dict[str, int] = {}
        """_capture_order's names, for the document in _order_of."""
        self._first_rows: dict[str, int] = {}
        """The row of each name's first capture, kept through edits: an edit that reaches one, or brings a name
        above it, can change _order (_order_may_change)."""
        self._order_of: object = None
        self._pending_edit: tuple[Tree, int, int, int] | None = None
        """While edit() runs: the tree before it (tree-sitter has applied the edit to it), the first and last rows it
        replaces, and the document's line count before it; _build_highlight_map takes it."""
        super().__init__(*args, **kwargs)

    def _build_highlight_map(self) -> None:
        """TextArea's highlight map, for the window of rows around the view: `_highlights[row]` holds (start column,
        end column or None for the line's end, highlight name) for each captured node on that row.

        After an edit inside the window, only the rows it could change are queried again: the edited rows and those
        whose syntax tree-sitter says changed (Tree.changed_ranges); the rows below move by the lines it added."""
        pending, self._pending_edit = self._pending_edit, None
        if self.soft_wrap:  # the view's rows are wrapped lines, not the document's: TextArea's whole map
            self._window = None
            if pending is not None:  # the name order is taken again once the window's map is back
                self._order_of = None
            super()._build_highlight_map()
            return
        self._line_cache.clear()
        highlights = self._highlights
        if not self._highlight_query:
            highlights.clear()
            self._window = None
            return
        reordered = False
        if pending is not None:
            old_tree, first, old_last, old_count = pending
            delta = self.document.line_count - old_count
            lo, hi = first, old_last + delta + 1
            for changed in old_tree.changed_ranges(self._syntax_tree()):
                lo, hi = min(lo, changed.start_point[0]), max(hi, changed.end_point[0] + 1)
            captures = self.document.query_syntax_tree(self._highlight_query, start_point=(lo, 0),
                                                       end_point=(hi, 0))
            reordered = self._follow_edit(captures, first, old_last, delta, lo, hi)
        top, height = self.scroll_offset.y, max(self.size.height, 1)
        window = self._window
        if pending is None or window is None or top < window.start or top + height > window.stop:
            highlights.clear()
            window = self._window = range(max(0, top - height), top + 2 * height)
            self._fill(window.start, window.stop)
            return
        if reordered:  # every row's colours may differ: the whole window again
            highlights.clear()
            self._fill(window.start, window.stop)
            return
        moved = {row + delta: spans for row, spans in highlights.items() if row > old_last}
        for row in [row for row in highlights if row >= first]:
            del highlights[row]
        highlights.update(moved)
        spans = [(max(lo, window.start), min(hi, window.stop))]
        if delta < 0:  # rows from below the window moved into it
            spans.append((max(window.stop + delta, hi), window.stop))
        for i, (start, stop) in enumerate(spans):
            if start < stop:
                for row in range(start, stop):
                    highlights.pop(row, None)
                self._fill(start, stop, captures if i == 0 else None)

    def _follow_edit(self, captures: dict[str, list[Any]], first: int, old_last: int, delta: int, lo: int,
                     hi: int) -> bool:
        """Keep the names' order and first rows through an edit (see _order_may_change's arguments); True when the
        order changed, so that every row's colours may have."""
        if self._order_of is not self.document:  # no order taken for this document yet: the next fill takes it
            return False
        if not self._order_may_change(captures, first, old_last, delta, lo, hi):
            self._first_rows = {name: row + delta if row > old_last else row for name, row in self._first_rows.items()}
            return False
        before = list(self._order)
        self._order_of = None
        return list(self._capture_order()) != before

    def _order_may_change(self, captures: dict[str, list[Any]], first: int, old_last: int, delta: int, lo: int,
                          hi: int) -> bool:
        """Whether an edit of rows first..old_last, whose syntax changed on rows lo..hi (after it; `captures` is a
        query over them), can change the order of the names' first captures: it reached a name's first capture, or
        brought a name (or a new one) above it. Otherwise every first capture kept its place, moved by the edit."""
        first_rows = self._first_rows
        for name, nodes in captures.items():
            known = first_rows.get(name)
            if known is None or min(node.start_point[0] for node in nodes) < (known + delta if known > old_last
                                                                                else known):
                return True
        for row in first_rows.values():
            if first <= row <= old_last or lo <= (row + delta if row > old_last else row) < hi:
                return True
        return False

    def _fill(self, start: int, stop: int, captures: dict[str, list[Any]] | None = None) -> None:
        """Add the highlights of rows start..stop (which hold none) from one query over them (or `captures`, a query
        over rows that include them)."""
        highlights = self._highlights
        if captures is None:
            captures = self.document.query_syntax_tree(self._highlight_query, start_point=(start, 0),
                                                       end_point=(stop, 0))
        # A token that two captures name takes the colour of the one applied last, and TextArea applies the names in
        # the order they first occur in the whole document: that order is taken once per document (one query over
        # all of it) and kept through its edits, so the window's rows get TextArea's colours; an edit that may move a
        # name's first occurrence takes it again (_order_may_change), as TextArea's whole query would.
        # The query hands a name's nodes in no fixed order; one name's overlaps draw alike, so they are put in document
        # order (and names first seen after the document was loaded by name): a row's list is the same whatever rows
        # the query covered, which is what lets an edit query only its rows, and _repaint_changed_rows skip the rest.
        order = self._capture_order()
        for name, nodes in sorted(captures.items(), key=lambda item: (order.get(item[0], len(order)), item[0])):
            for node in sorted(nodes, key=_span):
                (first, column), (last, end) = node.start_point, node.end_point
                for row in range(max(first, start), min(last, stop - 1) + 1):
                    highlights[row].append((column if row == first else 0, end if row == last else None, name))

    def _syntax_tree(self) -> Tree:
        """The document's tree-sitter tree (Textual keeps it private; pinned at 8.2.8)."""
        document = self.document
        assert isinstance(document, SyntaxAwareDocument)
        return document._syntax_tree

    def _capture_order(self) -> dict[str, int]:
        """The highlight names in the order they first occur in the document, from one query over all of it when the
        document is new (load_text makes a new one) or an edit may have moved a name's first capture
        (_order_may_change; other edits keep it). A name first seen later goes after them."""
        if self._order_of is not self.document:
            captures = self.document.query_syntax_tree(self._highlight_query)
            self._order = {name: i for i, name in enumerate(captures)}
            self._first_rows = {name: min(node.start_point[0] for node in nodes) for name, nodes in captures.items()}
            self._order_of = self.document
        return self._order

    def render_lines(self, crop: Region) -> list[Strip]:
        window, top = self._window, self.scroll_offset.y
        if window is not None and (top < window.start or top + self.size.height > window.stop):
            self._build_highlight_map()
        view = self._view_key()
        if view != self._drawn_view:
            self._drawn.clear()
            self._drawn_view = view
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        line = self.scroll_offset.y + y
        self._drawn[y] = self._row_keys(range(line, line + 1))[0]
        return super().render_line(y)

    def edit(self, edit: Edit) -> EditResult:
        document = self.document
        if isinstance(document, SyntaxAwareDocument):
            self._pending_edit = (self._syntax_tree(), edit.top[0], edit.bottom[0], document.line_count)
        try:
            result = super().edit(edit)
        finally:
            self._pending_edit = None
        self._repaint_changed_rows()  # now that the highlights are the new text's
        return result

    def _watch_selection(self, previous_selection: Selection, selection: Selection) -> None:
        super()._watch_selection(previous_selection, selection)
        if self._pending_edit is None:  # an edit sets the selection before its highlights: edit() repaints after
            self._repaint_changed_rows()

    def _view_key(self) -> tuple[Any, ...]:
        """What every row's drawing depends on: a change repaints the whole view."""
        return (self.size, self.scroll_offset, self.soft_wrap, self.gutter_width, self.virtual_size.width,
                self.theme, self.has_focus, self._has_cursor, self.show_line_numbers, self.line_number_start,
                self.highlight_cursor_line, self.indent_width, self.suggestion, self.read_only)

    def _row_keys(self, lines: range) -> list[tuple[Any, ...]]:
        """For each document row of `lines` (no soft wrap), what it is drawn from: its text and highlights, and the
        selection, cursor and matching bracket where they touch it."""
        document, highlights = self.document, self._highlights
        count = document.line_count
        start, end = self.selection
        (first, _), (last, _) = sorted((start, end))
        selected = (start, end) if start != end else None
        cursor_row, cursor = end[0], (end[1], self._draw_cursor)
        bracket = self._matching_bracket_location
        bracket_row = bracket[0] if bracket is not None else -1
        keys: list[tuple[Any, ...]] = []
        for line in lines:
            if line >= count:
                keys.append(())
                continue
            on_cursor = line == cursor_row
            keys.append((line, document.get_line(line), tuple(highlights.get(line, ())),
                         selected if first <= line <= last else None, cursor if on_cursor else None,
                         bracket if on_cursor or line == bracket_row else None))
        return keys

    def _repaint_changed_rows(self) -> None:
        """Repaint the view rows whose row key changed since they were drawn; all of them if the view key did."""
        if not self.is_mounted:
            return
        if self.soft_wrap or self._view_key() != self._drawn_view:
            self.refresh()
            return
        top, drawn = self.scroll_offset.y, self._drawn
        for y, key in enumerate(self._row_keys(range(top, top + self.size.height))):
            if drawn.get(y) != key:
                self.refresh_lines(y)
