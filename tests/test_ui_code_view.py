"""CodeView draws what TextArea draws, though it takes highlights for the rows near the view only; the kernel pane's
edits replace only the lines that changed and always end with the new source."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.geometry import Region
from textual.widgets import TextArea
from textual.widgets.text_area import Selection

from workbench.ui.widgets.code_view import CodeView
from workbench.ui.widgets.kernel_view import _replace_changed_lines, changed_lines

SOURCE = (Path(__file__).resolve().parents[1] / "kernels" / "kda" / "kda_chunked.py").read_text()


class Pair(App[None]):
    """The same document in a plain TextArea and in a CodeView, side by side and of the same size."""

    CSS = "TextArea { width: 1fr; height: 1fr; }"

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield TextArea.code_editor(SOURCE, language="python", read_only=True, theme="css", id="plain")
            yield CodeView.code_editor(SOURCE, language="python", read_only=True, theme="css", id="ours")


def rows(editor: TextArea) -> list:
    """Every row the editor draws now, as segments (text, style)."""
    width, height = editor.outer_size
    return [list(strip) for strip in editor.render_lines(Region(0, 0, width, height))]


async def test_code_view_draws_the_rows_textarea_draws_wherever_it_is_scrolled_and_after_edits() -> None:
    app = Pair()
    async with app.run_test(size=(200, 30)) as pilot:
        plain, ours = app.query_one("#plain", TextArea), app.query_one("#ours", CodeView)
        app.set_focus(None)  # a focused editor has another border
        await pilot.pause()
        # a docstring spans rows 0-28: its middle rows take their colour from a node that starts before them
        for y in (0, 12, 40, 41, 200, 120, 480, 0, 300):
            for editor in (plain, ours):
                editor.scroll_to(y=y, animate=False, immediate=True)
            await pilot.pause()
            assert ours.scroll_offset == plain.scroll_offset
            assert rows(ours) == rows(plain), y
        edited = SOURCE.replace('"prep_nreg": 168,', '"prep_nreg": 128,', 1)
        edited = edited.replace('"""Our chunked KDA', '"""(edited)\nOur chunked KDA')
        assert edited.count("\n") == SOURCE.count("\n") + 1 and '"prep_nreg": 128,' in edited  # both edits took
        for text in (edited, SOURCE):
            for editor in (plain, ours):
                editor.replace(text, (0, 0), editor.document.end)
                editor.scroll_to(y=150, animate=False, immediate=True)
            await pilot.pause()
            assert rows(ours) == rows(plain)
        await pilot.resize_terminal(200, 60)  # a taller view than the window the highlights were taken for
        await pilot.pause()
        for editor in (plain, ours):
            editor.scroll_to(y=150, animate=False, immediate=True)
        await pilot.pause()
        assert rows(ours) == rows(plain)
        assert len(ours._window) < ours.document.line_count  # the point: not the whole document


async def test_a_wrapping_code_view_draws_what_a_wrapping_textarea_draws() -> None:
    """With soft wrap the view's rows are wrapped lines, not document rows: CodeView takes TextArea's whole map."""
    app = Pair()
    async with app.run_test(size=(100, 30)) as pilot:
        plain, ours = app.query_one("#plain", TextArea), app.query_one("#ours", CodeView)
        app.set_focus(None)
        for editor in (plain, ours):
            editor.soft_wrap = True
        await pilot.pause()
        for y in (0, 300, 700):
            for editor in (plain, ours):
                editor.scroll_to(y=y, animate=False, immediate=True)
            await pilot.pause()
            assert rows(ours) == rows(plain), y


@pytest.mark.parametrize("old, new, span", [
    (["a", "b", "c"], ["a", "B", "c"], (1, 2, 2)),
    (["a", "b", "c"], ["a", "b", "c"], (3, 3, 3)),
    (["a", "c"], ["a", "b", "c"], (1, 1, 2)),
    (["a", "b", "c"], ["a", "c"], (1, 2, 1)),
    (["a", "b"], ["x", "y", "z"], (0, 2, 3)),
    (["a", "a"], ["a"], (1, 2, 1)),
])
def test_changed_lines_finds_the_span_between_the_common_head_and_tail(old, new, span) -> None:
    assert changed_lines(old, new) == span
    first, old_stop, new_stop = span
    assert old[:first] + new[first:new_stop] + old[old_stop:] == new


async def test_kernel_pane_edits_always_end_with_the_new_source() -> None:
    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield CodeView.code_editor("x = 1\n", language="python", read_only=True)

    rng = random.Random(5)
    pool = ["import torch", "", "x = 1", "def f(a):", "    return a", "CONFIG = {'BLOCK': 64}", '"""doc"""']
    app = One()
    async with app.run_test(size=(80, 20)) as pilot:
        editor = app.query_one(CodeView)
        for _ in range(60):
            source = "\n".join(rng.choice(pool) for _ in range(rng.randrange(0, 9)))
            source += rng.choice(["", "\n"])
            _replace_changed_lines(editor, source)
            assert editor.text == source
        await pilot.pause()


class Alone(App[None]):
    """One CodeView of SOURCE."""

    CSS = "CodeView { height: 1fr; }"

    def compose(self) -> ComposeResult:
        yield CodeView.code_editor(SOURCE, language="python", read_only=True, theme="css")


def window_map(editor: CodeView) -> dict[int, list]:
    window = editor._window
    assert window is not None
    return {row: list(editor._highlights.get(row, ())) for row in window}


async def test_an_edit_queries_only_what_it_changed_and_gives_the_map_a_whole_query_gives() -> None:
    """Random line edits (quotes and brackets that change the syntax of rows far below them included): after each,
    the window's highlights are the ones a query over the whole window gives."""
    rng = random.Random(3)
    pool = ['"""', "'", "(", ")", "# note", "def f(a,", "x = [1,", "]", "", "    return a", "class K:", "'''doc'''"]
    app = Alone()
    async with app.run_test(size=(120, 30)) as pilot:
        editor = app.query_one(CodeView)
        editor.scroll_to(y=100, animate=False, immediate=True)
        await pilot.pause()
        editor.render_lines(Region(0, 0, 120, 30))  # the window follows the view
        incremental_steps = 0
        for step in range(120):
            window = editor._window
            assert window is not None
            editor.selection = Selection.cursor((editor.scroll_offset.y, 0))  # in the view: no edit scrolls it
            row = rng.randrange(window.start, min(window.stop, editor.document.line_count - 1))
            kind = rng.choice(["replace", "insert", "delete"])
            text = rng.choice(pool)
            if kind == "replace":
                editor.replace(text, (row, 0), (row, len(editor.document.get_line(row))))
            elif kind == "insert":
                editor.insert(text + "\n", (row, 0))
            else:
                editor.delete((row, 0), (min(row + rng.randrange(1, 4), editor.document.line_count - 1), 0))
            if editor._window is not window:
                continue  # the view left the window: a whole query was made anyway
            incremental_steps += 1
            incremental = window_map(editor)
            saved = {row: list(spans) for row, spans in editor._highlights.items()}
            editor._window = None
            editor._build_highlight_map()  # the whole window's query, for the view (a deletion may have moved it)
            whole = window_map(editor)
            both = incremental.keys() & whole.keys()
            assert len(both) > 60
            assert {row: whole[row] for row in both} == {row: incremental[row] for row in both}, (step, kind, row, [(r, sorted(set(whole[r]) ^ set(incremental[r])), editor.document.get_line(r)) for r in sorted(both) if whole[r] != incremental[r]][:3])
            editor._highlights.clear()
            editor._highlights.update(saved)  # go on from the edited map, so that errors would pile up
            editor._window = window
        assert incremental_steps > 100


async def test_an_edit_or_a_cursor_move_repaints_only_the_rows_it_changes() -> None:
    app = Pair()
    async with app.run_test(size=(200, 30)) as pilot:
        plain, ours = app.query_one("#plain", TextArea), app.query_one("#ours", CodeView)
        app.set_focus(None)
        await pilot.pause()
        drawn: list[int] = []
        render_line = ours.render_line

        def counted(y: int):  # noqa: ANN202 - Strip
            drawn.append(y)
            return render_line(y)

        ours.render_line = counted  # type: ignore[method-assign]
        row = 5
        for editor in (plain, ours):
            editor.replace("x = 1  # edited", (row, 0), (row, len(editor.document.get_line(row))))
        await pilot.pause()
        assert drawn == [row]
        assert rows(ours) == rows(plain)
        drawn.clear()
        for editor in (plain, ours):
            editor.selection = Selection.cursor((12, 3))
        await pilot.pause()
        assert sorted(drawn) == [0, 12]  # where the cursor was, and where it is
        assert rows(ours) == rows(plain)
        for editor in (plain, ours):
            editor.insert('"""', (8, 0))  # closes the module's docstring early: rows above and below it change too
        await pilot.pause()
        assert rows(ours) == rows(plain)


ORDER_SOURCE = '''"""Doc.
The second form of V' (m_scan 2) lets the prep store M and Gamma K and never form W or U, so that it reads no V
and writes no U, while the scan applies M to V - (Gamma K) S, one 64x64xBV product more on its chain.

Exponent range (KERNELS.md section 1.4): exp2(G_r - G_j) is split into a row and a column factor around an
anchor that is always a past row of the rows it serves.
"""


BT = 64
CONFIG = {"BV": None, "BK": 32}
CONFIG = {"BV": None, "BK": 64}
'''
"""Closing the docstring on row 1 turns its words into code: with the names' order kept from before, "range" on
row 4 takes another colour than TextArea gives it."""


class PairOf(Pair):
    """Pair, of another source."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield TextArea.code_editor(self.source, language="python", read_only=True, theme="css", id="plain")
            yield CodeView.code_editor(self.source, language="python", read_only=True, theme="css", id="ours")


async def test_an_edit_that_moves_a_names_first_capture_colours_what_textarea_colours() -> None:
    """TextArea applies the highlight names in the order of their first captures in the whole document, and a token
    two names capture takes the colour of the one applied last. Closing the docstring early turns its words into
    code, where some names are then captured first: the colours follow. A one-line edit below that reaches no name's
    first capture makes no whole-document query."""
    app = PairOf(ORDER_SOURCE)
    async with app.run_test(size=(160, 24)) as pilot:
        plain, ours = app.query_one("#plain", TextArea), app.query_one("#ours", CodeView)
        app.set_focus(None)
        await pilot.pause()
        assert rows(ours) == rows(plain)
        document = ours.document
        query = document.query_syntax_tree
        whole: list[int] = []

        def counted(q, start_point=None, end_point=None):  # noqa: ANN001, ANN202 - the document's own signature
            if start_point is None:
                whole.append(1)
            return query(q, start_point=start_point, end_point=end_point)

        document.query_syntax_tree = counted  # type: ignore[method-assign]
        for editor in (plain, ours):
            editor.replace('CONFIG = {"BV": None, "BK": 128}', (11, 0), (11, len(editor.document.get_line(11))))
        await pilot.pause()
        assert rows(ours) == rows(plain) and not whole
        for editor in (plain, ours):
            editor.insert('"""', (1, 0))  # the docstring ends on row 1: the rows below it are code now
        await pilot.pause()
        assert rows(ours) == rows(plain)
        assert whole == [1]
        for editor in (plain, ours):
            editor.delete((1, 0), (1, 3))
        await pilot.pause()
        assert rows(ours) == rows(plain)
        # the same edit made while wrapping goes to TextArea's whole map (one whole query); the window's next map
        # takes the name order again (one more), since the edit was not followed
        for editor in (plain, ours):
            editor.soft_wrap = True
        await pilot.pause()
        whole.clear()
        for editor in (plain, ours):
            editor.insert('"""', (1, 0))
        await pilot.pause()
        for editor in (plain, ours):
            editor.soft_wrap = False
        await pilot.pause()
        for editor in (plain, ours):
            editor.insert("\n", (12, 0))
        await pilot.pause()
        assert rows(ours) == rows(plain)
        assert whole == [1, 1]
