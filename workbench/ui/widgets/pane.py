"""Pane: a bordered box of the live and review screens (kernel, evaluation, profile); its border lights on focus."""

from __future__ import annotations

from textual.containers import Vertical


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
