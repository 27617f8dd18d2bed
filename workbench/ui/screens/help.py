"""HelpScreen: the keys that work on the screen below, as the keymap has set them."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Label

from workbench.ui.screens.dialog import Dialog


class HelpScreen(Dialog[None]):
    """Lists (keys, action, binding id, what it does); the id is what a [keymap] entry remaps."""

    DEFAULT_CSS = """
    HelpScreen > #dialog { width: 116; max-width: 100%; max-height: 90%; }
    HelpScreen DataTable { height: auto; max-height: 24; background: $surface; }
    HelpScreen #hint { color: $text-muted; margin-top: 1; }
    """

    BINDINGS = [Binding("escape,f1,question_mark", "close", "Close", id="help.close", tooltip="Close the help")]

    def __init__(self, rows: list[tuple[str, str, str, str]]) -> None:
        super().__init__()
        self._rows = rows
        """(keys, description, binding id, tooltip) for each binding of the screen below."""

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog") as dialog:
            dialog.border_title = "Keys"
            table: DataTable[Text] = DataTable(cursor_type="none", zebra_stripes=True)
            table.add_columns("keys", "action", "binding id", "what it does")
            for row in self._rows:
                # Text, not str: a str cell is parsed as markup, and tooltips may contain brackets.
                table.add_row(*(Text(cell) for cell in row))
            yield table
            yield Label("Remap any key in config.toml: [keymap] <id> = \"keys\".  Esc closes.", id="hint",
                        markup=False)

    def action_close(self) -> None:
        self.dismiss(None)
