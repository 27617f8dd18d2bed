"""ErrorScreen: a worker failed; say what happened and that the session is safe on disk."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Label

from workbench.ui.screens.dialog import Dialog


class ErrorScreen(Dialog[None]):
    """Replaces a crash: the journal already holds every acknowledged event, so nothing is lost."""

    DEFAULT_CSS = """
    ErrorScreen > #dialog { width: 84; max-height: 80%; border: round $error; border-title-color: $text-error; }
    ErrorScreen #error { width: 100%; color: $text-error; margin-bottom: 1; }
    ErrorScreen #hint { width: 100%; color: $text-muted; }
    """

    BINDINGS = [
        Binding("escape,enter", "close", "Close", id="error.close", tooltip="Close this message"),
    ]

    def __init__(self, title: str, error: str, hint: str) -> None:
        super().__init__()
        self._title = title
        self._error = error
        self._hint = hint

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog") as dialog:
            dialog.border_title = self._title
            yield Label(self._error, id="error", markup=False)
            yield Label(self._hint, id="hint", markup=False)

    def action_close(self) -> None:
        self.dismiss(None)
