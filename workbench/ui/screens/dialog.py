"""Dialog: a modal box centred over the screen; a subclass sets its width and what it holds."""

from __future__ import annotations

from typing import TypeVar

from textual.screen import ModalScreen
from textual.widgets import Input

ResultType = TypeVar("ResultType")


class Dialog(ModalScreen[ResultType]):
    """The look every dialog shares: its #dialog container, centred, bordered, on the surface colour."""

    DEFAULT_CSS = """
    Dialog { align: center middle; }
    Dialog > #dialog {
        height: auto;
        border: round $border;
        border-title-color: $text-primary;
        background: $surface;
        padding: 1 2;
    }
    Dialog.-tall > #dialog { max-width: 100%; height: 90%; border-subtitle-color: $text-muted; }
    """
    TALL = "-tall"
    """The class of a dialog as tall as the screen allows (a list, a long text), its subtitle a hint."""


class InputDialog(Dialog[ResultType]):
    """A dialog that asks for one line of text: its Input has the focus from the start."""

    def __init__(self, *, cursor_blink: bool = True) -> None:
        super().__init__()
        self.cursor_blink = cursor_blink
        """Whether the Input's cursor blinks (off in tests, so snapshots are stable)."""

    def text_input(self, placeholder: str, id: str) -> Input:
        """The dialog's Input."""
        field = Input(placeholder=placeholder, id=id)
        field.cursor_blink = self.cursor_blink
        return field

    def on_mount(self) -> None:
        self.query_one(Input).focus()
