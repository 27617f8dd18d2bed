"""NudgeScreen: the modal in which the person writes a nudge for the agent."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Checkbox, Input, Label

from workbench.ui.screens.dialog import InputDialog


@dataclass(frozen=True)
class NudgeRequest:
    """What the dialog returns: the hint and whether it stays in every prompt until revoked."""

    text: str
    persistent: bool


class NudgeScreen(InputDialog[NudgeRequest | None]):
    """Asks for a nudge; Enter sends it, Esc closes without sending."""

    DEFAULT_CSS = """
    NudgeScreen > #dialog { width: 76; }
    NudgeScreen #hint { width: 100%; color: $text-muted; margin-bottom: 1; }
    NudgeScreen Input { margin-bottom: 1; }
    NudgeScreen #buttons { height: auto; align-horizontal: right; }
    NudgeScreen Button { margin-left: 2; }
    """

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="nudge.cancel", tooltip="Close without sending anything"),
        Binding("f2", "toggle_persistent", "Persistent", id="nudge.persistent",
                tooltip="Keep the nudge in every prompt until it is revoked, instead of delivering it once"),
    ]

    def __init__(self, *, read_only_note: str = "", cursor_blink: bool = True) -> None:
        super().__init__(cursor_blink=cursor_blink)
        self._note = read_only_note
        """Where the nudge goes when this TUI does not drive the agent (attach mode)."""

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog") as dialog:
            dialog.border_title = "Nudge the agent"
            yield Label(
                "The agent reads it at the next step boundary; it is journaled as nudge.received."
                + (f"\n{self._note}" if self._note else ""),
                id="hint",
                markup=False,
            )
            yield self.text_input("e.g. try BLOCK_SIZE=2048 with num_warps=16", "text")
            yield Checkbox("Persistent: keep it in every prompt until revoked (F2)", id="persistent")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel")
                yield Button("Send", id="send", variant="primary")

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_toggle_persistent(self) -> None:
        self.query_one("#persistent", Checkbox).toggle()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted, "#text")
    @on(Button.Pressed, "#send")
    def _send(self) -> None:
        text = self.query_one("#text", Input).value.strip()
        if not text:
            self.notify("Write the nudge first (Esc closes the dialog).", severity="warning")
            return
        self.dismiss(NudgeRequest(text, self.query_one("#persistent", Checkbox).value))
