"""Rich styles taken from the current theme, for widgets that render Rich text (DataTable cells, event log lines)."""

from __future__ import annotations

from typing import Mapping

from rich.style import Style
from textual.color import Color, ColorParseError


def theme_style(variables: Mapping[str, str], name: str, *, bold: bool = False) -> Style:
    """A Rich style in the colour of theme variable `name` (e.g. 'text-success').

    TCSS cannot reach inside a DataTable cell or an event log line, so these widgets build their styles from
    App.theme_variables instead of naming colours, and rebuild them when the theme changes.
    A variable Textual cannot parse (an 'auto' colour, say) gives an uncoloured style rather than an error.
    """
    value = variables.get(name)
    color = None
    if value:
        try:
            color = Color.parse(value).rich_color
        except ColorParseError:
            color = None
    return Style(color=color, bold=bold or None)


MUTED = Style(dim=True)
"""Secondary text: dimming works on every theme, including the ANSI one, where 'text-muted' has an alpha."""


def verdict_variable(verdict: str | None) -> str:
    """The theme variable for a verdict: green for ok, amber for the ones a person should look at, red for failures."""
    if verdict == "ok":
        return "text-success"
    if verdict in ("implausible", "timeout"):
        return "text-warning"
    if verdict is None:
        return "foreground-muted"
    return "text-error"
