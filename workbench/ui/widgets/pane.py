"""Pane: a bordered box of the live and review screens (kernel, evaluation, profile); its border lights on focus."""

from __future__ import annotations

from textual.containers import Vertical
from textual.content import Content


def pane_css(selector: str, focus: str = ":focus-within") -> str:
    """The look every pane shares, for a widget that cannot be a Pane (the event log is a ScrollView)."""
    return f"""
    {selector} {{
        border: round $border-blurred;
        border-title-color: $text-primary;
        border-subtitle-color: $text-muted;
        background: $surface;
    }}
    {selector}{focus} {{ border: round $border; }}
    """


class Pane(Vertical):
    """A box with the pane look; a subclass adds only what is its own."""

    DEFAULT_CSS = pane_css("Pane")

    def set_titles(self, title: str | Content, subtitle: str | Content) -> None:
        """Set the border's title and subtitle, each only if it reads differently: Textual repaints the whole pane on
        every assignment of either, and a pane that redraws on each evaluation would otherwise repaint its border, its
        other widgets and the containers around it each time for nothing."""
        for name, value in (("border_title", title), ("border_subtitle", subtitle)):
            if getattr(self, name) != (value.markup if isinstance(value, Content) else value):
                setattr(self, name, value)
