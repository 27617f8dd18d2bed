"""DiffView: a unified diff, highlighted with the theme's success and error colours, in a scrolling pane."""

from __future__ import annotations

from pygments.token import Token
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.highlight import HighlightTheme, highlight
from textual.widgets import Static


class DiffTheme(HighlightTheme):
    """HighlightTheme has no styles for inserted and deleted lines; a diff is mostly those."""

    STYLES = {
        **HighlightTheme.STYLES,
        Token.Generic.Inserted: "$text-success",
        Token.Generic.Deleted: "$text-error",
        Token.Generic.Subheading: "$text-accent",
        Token.Generic.Heading: "bold $text-primary",
    }


class DiffView(VerticalScroll):
    """Shows one diff; redrawn when the text changes or the theme does (styles are resolved at render time).

    Long lines wrap rather than scroll sideways: the change in a long launch line is usually at its end.
    """

    DEFAULT_CSS = """
    DiffView { background: $surface; scrollbar-size-vertical: 1; }
    DiffView > Static { width: 1fr; padding: 0 1; }
    DiffView > Static.-empty { color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.text = ""
        """The unified diff shown ('' shows `note` instead)."""
        self.note = ""
        """Why there is no diff to show (no parent, identical sources, ...)."""

    def compose(self) -> ComposeResult:
        yield Static("", id="diff-text")

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._render_text())

    def show(self, text: str, note: str = "") -> None:
        """Show the diff `text`, or `note` in muted text when `text` is empty.

        Scrolls back to the top when the diff itself changes, since the old position means nothing in a new one.
        """
        if (text, note) == (self.text, self.note):
            return
        self.text, self.note = text, note
        self._render_text()
        self.scroll_home(animate=False)

    def _render_text(self) -> None:
        static = self.query_one("#diff-text", Static)
        static.set_class(not self.text, "-empty")
        if self.text:
            static.update(highlight(self.text, language="diff", theme=DiffTheme))
        else:
            # Content, not a str: the note quotes attempt notes, which may hold markup-like brackets.
            static.update(Content(self.note))
