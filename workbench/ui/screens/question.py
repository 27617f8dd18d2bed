"""QuestionScreen: the runtime asks the person something and waits for the answer."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class QuestionScreen(ModalScreen[str | None]):
    """Shows the question; Enter answers, Esc declines (the runtime then sees a cancelled future)."""

    DEFAULT_CSS = """
    QuestionScreen { align: center middle; }
    QuestionScreen > #dialog {
        width: 76;
        height: auto;
        border: round $border;
        border-title-color: $text-accent;
        background: $surface;
        padding: 1 2;
    }
    QuestionScreen #question { width: 100%; margin-bottom: 1; }
    QuestionScreen #hint { color: $text-muted; margin-top: 1; }
    """

    BINDINGS = [Binding("escape", "decline", "Decline", id="question.decline",
                        tooltip="Close without answering; the agent carries on without an answer")]

    def __init__(self, question: str, *, cursor_blink: bool = True) -> None:
        super().__init__()
        self._question = question
        self._cursor_blink = cursor_blink

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog") as dialog:
            dialog.border_title = "The agent asks"
            yield Label(self._question, id="question", markup=False)
            answer = Input(placeholder="your answer", id="answer")
            answer.cursor_blink = self._cursor_blink
            yield answer
            yield Label("Enter answers · Esc declines", id="hint")

    def on_mount(self) -> None:
        self.query_one("#answer", Input).focus()

    def action_decline(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted, "#answer")
    def _answer(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)
