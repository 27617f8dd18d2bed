"""QuestionScreen: the runtime asks the person something and waits for the answer."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Input, Label

from workbench.ui.screens.dialog import InputDialog


class QuestionScreen(InputDialog[str | None]):
    """Shows the question; Enter answers, Esc declines (the runtime then sees a cancelled future)."""

    DEFAULT_CSS = """
    QuestionScreen > #dialog { width: 76; border-title-color: $text-accent; }
    QuestionScreen #question { width: 100%; margin-bottom: 1; }
    QuestionScreen #hint { color: $text-muted; margin-top: 1; }
    """

    BINDINGS = [Binding("escape", "decline", "Decline", id="question.decline",
                        tooltip="Close without answering; the agent carries on without an answer")]

    def __init__(self, question: str, *, cursor_blink: bool = True) -> None:
        super().__init__(cursor_blink=cursor_blink)
        self._question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog") as dialog:
            dialog.border_title = "The agent asks"
            yield Label(self._question, id="question", markup=False)
            yield self.text_input("your answer", "answer")
            yield Label("Enter answers · Esc declines", id="hint")

    def action_decline(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted, "#answer")
    def _answer(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)
