"""KeyedTable: rows by key, columns that only widen, and a row drawn again only when its cells, the layout, the window
or the style change."""

from __future__ import annotations

from typing import Any, Sequence

import pytest
from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult
from textual.pilot import Pilot

from workbench.ui.widgets.keyed_table import Column, KeyedTable

COLUMNS = (Column("name", "name"), Column("ms", "ms"), Column("note", "note", 4))


class TableApp(App[None]):
    CSS = "KeyedTable { width: 30; }"

    def compose(self) -> ComposeResult:
        yield KeyedTable(*COLUMNS)


def cells(**rows: str) -> dict[str, list[Text]]:
    return {key: [Text(key), Text(value, justify="right"), Text("")] for key, value in rows.items()}


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The first cell of every row KeyedTable draws (the header's is its first label), in order."""
    out: list[str] = []
    render = KeyedTable._render_row

    def counted(table: KeyedTable, row: Sequence[Text], *args: Any) -> Any:
        out.append(row[0].plain)
        return render(table, row, *args)

    monkeypatch.setattr(KeyedTable, "_render_row", counted)
    return out


def line(table: KeyedTable, y: int) -> str:
    return table.render_line(y).text


async def paint(pilot: Pilot[Any], drawn: list[str]) -> list[str]:
    """What the next frame draws."""
    drawn.clear()
    await pilot.pause()
    return sorted(drawn)


async def test_rows_follow_the_keys_and_columns_only_widen() -> None:
    app = TableApp()
    async with app.run_test() as pilot:
        table = app.query_one(KeyedTable)
        table.sync_rows(cells(S1="0.0300", S2="0.0600"))
        await pilot.pause()
        assert list(table.rows) == ["S1", "S2"]
        width, size = table.content_width("ms"), table.virtual_size
        assert width == len("0.0300") and size == (4 + 6 + 4 + 3 * 2, 3)
        table.sync_rows(cells(S1="0.1", S2="0.2"))  # narrower: the column keeps its width
        await pilot.pause()
        assert table.get_cell("S1", "ms") == Text("0.1")
        assert table.content_width("ms") == width and table.virtual_size == size
        table.sync_rows(cells(S2="12345.6789", S3="1"))  # S1 leaves, S3 comes; a wider value widens
        await pilot.pause()
        assert list(table.rows) == ["S2", "S3"]
        assert table.content_width("ms") == len("12345.6789") > width
        table.sync_rows({"S2": [Text("S2"), Text("1"), Text("a long note")]})
        assert table.content_width("note") == 4, "a fixed width stays"


async def test_the_header_row_and_the_cells_padded_justified_and_cut() -> None:
    app = TableApp()
    async with app.run_test() as pilot:
        table = app.query_one(KeyedTable)
        table.sync_rows({"S1": [Text("S1"), Text("0.5", justify="right"), Text("too long")],
                         "S10": [Text("S10"), Text("12.25", justify="right"), Text("ok", justify="center")]})
        await pilot.pause()
        assert line(table, 0) == " name  ms     note ".ljust(30)
        assert line(table, 1) == " S1      0.5  too  ".ljust(30)
        assert line(table, 2) == " S10   12.25   ok  ".ljust(30)
        assert line(table, 3) == " " * 30
        header, row = table.render_line(0), table.render_line(1)
        assert all(segment.style is not None and segment.style.bold for segment in header if segment.text.strip())
        assert not any(segment.style and segment.style.bold for segment in row if segment.text.strip())


async def test_an_update_draws_only_the_rows_that_changed(drawn: list[str]) -> None:
    app = TableApp()
    async with app.run_test() as pilot:
        table = app.query_one(KeyedTable)
        table.sync_rows(cells(S1="0.03", S2="0.06", S3="0.09"))
        assert await paint(pilot, drawn) == ["S1", "S2", "S3", "name"]
        table.sync_rows(cells(S1="0.03", S2="0.05", S3="0.09"))
        assert await paint(pilot, drawn) == ["S2"]
        table.sync_rows(cells(S1="0.03", S2="0.05", S3="0.09"))
        assert await paint(pilot, drawn) == []
        table.refresh()  # the whole table painted again (a layout, say): every row is drawn already
        assert await paint(pilot, drawn) == []
        table.sync_rows(cells(S1="0.03", S2="0.05", S3="0.09", S4="0.12"))  # a row more is a layout
        assert await paint(pilot, drawn) == ["S4"]
        assert line(table, 2) == " S2    0.05".ljust(30)


async def test_a_cell_that_changes_only_its_style_is_drawn_again(drawn: list[str]) -> None:
    """Text's == ignores the style: a time that stops being the best must lose its colour."""
    app = TableApp()
    async with app.run_test() as pilot:
        table = app.query_one(KeyedTable)
        table.sync_rows({"S1": [Text("S1"), Text("0.03", style=Style(color="green")), Text("")]})
        await paint(pilot, drawn)
        table.sync_rows({"S1": [Text("S1"), Text("0.03"), Text("")]})
        assert await paint(pilot, drawn) == ["S1"]
        assert table.get_cell("S1", "ms").style == ""


async def test_rows_that_move_are_drawn_again_in_their_new_stripe(drawn: list[str]) -> None:
    app = TableApp()
    async with app.run_test() as pilot:
        table = app.query_one(KeyedTable)
        table.sync_rows(cells(S1="1", S2="2", S3="3"))
        await paint(pilot, drawn)
        even, odd = list(table.render_line(1))[0].style, list(table.render_line(2))[0].style
        assert even != odd
        table.sync_rows(cells(S2="2", S1="1", S3="3"))  # same cells, two rows swapped
        assert await paint(pilot, drawn) == ["S1", "S2"]
        assert list(table.render_line(1))[0].style == even and line(table, 1).startswith(" S2 ")
        table.sync_rows(cells(S1="1", S3="3"))
        assert await paint(pilot, drawn) == ["S1", "S3"]


async def test_a_new_width_a_scroll_or_a_theme_draws_every_row_again(drawn: list[str]) -> None:
    app = TableApp()
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.query_one(KeyedTable)
        table.sync_rows(cells(S1="1", S2="2"))
        await paint(pilot, drawn)
        table.styles.width = 24
        assert await paint(pilot, drawn) == ["S1", "S2", "name"]
        assert line(table, 1) == " S1     1".ljust(24)
        table.sync_rows({"S1": [Text("S1"), Text("1" * 30), Text("")], "S2": [Text("S2"), Text("2"), Text("")]})
        await paint(pilot, drawn)
        assert table.virtual_size.width > table.size.width
        table.scroll_to(x=7, animate=False, immediate=True)  # past " S1   " and the padding
        assert await paint(pilot, drawn) == ["S1", "S2", "name"]
        assert line(table, 1).startswith("1" * 10)
        app.theme = "textual-light" if app.theme != "textual-light" else "textual-dark"
        assert await paint(pilot, drawn) == ["S1", "S2", "name"]


async def test_the_header_stays_while_the_rows_scroll() -> None:
    app = TableApp()
    async with app.run_test() as pilot:
        table = app.query_one(KeyedTable)
        table.styles.max_height = 3
        table.sync_rows(cells(**{f"S{i}": str(i) for i in range(1, 6)}))
        await pilot.pause()
        table.scroll_to(y=2, animate=False, immediate=True)
        await pilot.pause()
        assert line(table, 0).startswith(" name ")
        assert line(table, 1).startswith(" S3 ")
