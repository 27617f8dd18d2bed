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
        edited = SOURCE.replace('"prep_nreg": 0, "wy_warps": 4}', '"prep_nreg": 0, "wy_warps": 8}')
        edited = edited.replace('"""Our chunked KDA', '"""(edited)\nOur chunked KDA')
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
