"""Changing a DataTable by row key (STYLE.md section 5): stale rows out, changed cells updated, new rows added."""

from __future__ import annotations

from typing import Mapping, Sequence

from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey


def sync_rows(table: DataTable[Text], rows: Mapping[str, Sequence[Text]], columns: Sequence[str]) -> None:
    """Make `table` hold exactly `rows` (row key -> cells in `columns` order), touching only what changed.

    Call it inside app.batch_update() and sort once afterwards; the table is never cleared, so the cursor and
    scroll position survive an update. Columns grow to fit longer values and never shrink back.
    """
    for row_key in list(table.rows):
        if row_key.value not in rows:
            table.remove_row(row_key)
    existing = {row_key.value for row_key in table.rows}
    for key, cells in rows.items():
        if key in existing:
            for column, cell in zip(columns, cells):
                if table.get_cell(key, column) == cell:
                    continue  # each update repaints the table: an unchanged cell costs a frame for nothing
                # A longer value widens its column (on idle) instead of being clipped; a shorter one leaves it as it
                # is. A column that followed its values narrowed and widened again between evaluations, and every
                # change of the table's width laid the whole screen out again (5-7 ms a frame on the live screen).
                wider = cell.cell_len > table.columns[ColumnKey(column)].content_width
                table.update_cell(key, column, cell, update_width=wider)
        else:
            table.add_row(*cells, key=key)
