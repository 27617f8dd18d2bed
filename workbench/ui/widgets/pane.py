"""Pane: a bordered box of the live and review screens (kernel, evaluation, profile); its border lights on focus."""

from __future__ import annotations

from textual.containers import Vertical
from textual.content import Content
from textual.geometry import Region
from textual.widget import Widget


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

    def __init__(self, *children: Widget, name: str | None = None, id: str | None = None, classes: str | None = None,
                 disabled: bool = False) -> None:
        super().__init__(*children, name=name, id=id, classes=classes, disabled=disabled)
        self._edge: Region | None = None
        """While set_titles assigns a title: the border row it is drawn on (content coordinates), which is all that
        Textual's repaint for the assignment needs."""

    def set_titles(self, title: str | Content, subtitle: str | Content) -> None:
        """Set the border's title and subtitle, each only if it reads differently, repainting the border row it is on.

        Textual repaints the whole pane on every assignment of either: its border, the widgets in it and the containers
        around it (a new attempt's title cost the kernel pane 1 ms of a frame for 26 rows, one of which changed).
        """
        left, top = self.content_offset
        width, height = self.outer_size
        for name, value, row in (("border_title", title, 0), ("border_subtitle", subtitle, height - 1)):
            if getattr(self, name) != (value.markup if isinstance(value, Content) else value):
                self._edge = Region(-left, row - top, width, 1)
                try:
                    setattr(self, name, value)
                finally:
                    self._edge = None

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False,
                recompose: bool = False) -> "Pane":
        if self._edge is not None and not regions and not layout and not recompose:
            regions = (self._edge,)
        super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)
        return self
