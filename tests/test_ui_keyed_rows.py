"""sync_rows: a DataTable changed by row key; its columns grow to fit a longer value and never shrink back."""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import DataTable

from workbench.ui.widgets.keyed_rows import sync_rows

COLUMNS = ("name", "ms")


class TableApp(App[None]):
    def compose(self) -> ComposeResult:
        table: DataTable[Text] = DataTable()
        for key in COLUMNS:
            table.add_column(key, key=key)
        yield table


def cells(**rows: str) -> dict[str, list[Text]]:
    return {key: [Text(key), Text(value)] for key, value in rows.items()}


async def test_rows_follow_the_keys_and_columns_only_widen() -> None:
    app = TableApp()
    async with app.run_test() as pilot:
        table = app.query_one(DataTable)
        sync_rows(table, cells(S1="0.0300", S2="0.0600"), COLUMNS)
        await pilot.pause()
        assert [row.value for row in table.rows] == ["S1", "S2"]
        width, size = table.columns["ms"].content_width, table.virtual_size
        sync_rows(table, cells(S1="0.1", S2="0.2"), COLUMNS)  # narrower: the column keeps its width
        await pilot.pause()
        assert table.get_cell("S1", "ms") == Text("0.1")
        assert table.columns["ms"].content_width == width and table.virtual_size == size
        sync_rows(table, cells(S2="12345.6789", S3="1"), COLUMNS)  # S1 leaves, S3 comes; a wider value widens
        await pilot.pause()
        assert [row.value for row in table.rows] == ["S2", "S3"]
        assert table.columns["ms"].content_width == len("12345.6789") > width
