"""RowFrame: what Textual's styles pipeline adds around a line-API widget's content rows, learned from one row it
draws, so that the widget's other rows are put together from strips it keeps instead of going through the pipeline.

Textual (8.2.8, pinned) draws every row of a refreshed widget again through `StylesCache.render_line`: it sets the
content strip in the side borders, then runs the app's line filters over the whole row (ANSIToTruecolor unless the
theme is ANSI; Monochrome or NoColor under NO_COLOR; DimFilter with TEXTUAL_FILTERS=dim). The content strip carries
each segment's selection offset, unique to its row and column, so the filters' style caches miss on every segment of
every frame: about 80 us a row of the 118-cell event log, against nothing for its line already drawn.

The filters recolour one segment at a time and keep its meta, so a row is the filtered border, the content filtered
before its offsets are applied, and the other border. A filtered strip is cached by the strip itself (Strip keeps its
filtered and offset copies), so a line already shown costs two lookups and a join. A frame is learned per `frame_key`
(sizes, borders, backgrounds, filters, ANSI theme): one content row is drawn by Textual, its border segments kept, and
the row put together here from the same content is compared with it; if they differ, or the styles ask for anything
else the pipeline adds (padding, outline, tint, hatch, opacity), the widget falls back to Textual's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.segment import Segment
from textual.color import Color
from textual.filter import LineFilter
from textual.geometry import Spacing
from textual.strip import Strip
from textual.widget import Widget

NO_SPACING = Spacing(0, 0, 0, 0)


def frame_key(widget: Widget) -> tuple[Any, ...] | None:
    """Everything StylesCache.render_widget reads for a content row of `widget`, or None if its styles ask for more
    than side borders and the app's filters (the widget then takes Textual's path)."""
    styles = widget.styles
    if (styles.padding != NO_SPACING or any(edge for edge, _color in styles.outline) or styles.tint.a
            or styles.text_opacity != 1.0 or styles.has_rule("hatch") or widget.opacity != 1.0):
        return None
    app = widget.app
    return (widget.region.size, widget.content_region.size, styles.border, widget.background_colors,
            tuple(app.get_line_filters()), app.ansi_theme, app.native_ansi_color)


def edge_key(widget: Widget, top: bool) -> tuple[Any, ...]:
    """What the top (or bottom) border row draws beyond the frame: its title (or subtitle) and that label's styles."""
    styles = widget.styles
    if top:
        return (widget.border_title, styles.border_title_align, styles.border_title_color,
                styles.border_title_background, styles.border_title_style, styles.auto_border_title_color)
    return (widget.border_subtitle, styles.border_subtitle_align, styles.border_subtitle_color,
            styles.border_subtitle_background, styles.border_subtitle_style, styles.auto_border_subtitle_color)


@dataclass(frozen=True)
class RowFrame:
    """How the styles pipeline draws a content row of one widget in one state (one `frame_key`)."""

    key: tuple[Any, ...]
    """The frame_key it was learned for."""
    rows: range
    """The widget's rows (in its outer region, as render_lines crops count) that hold content."""
    width: int
    """The widget's outer width in cells."""
    left: tuple[Segment, ...]
    """The left border's segments, filtered (none without a left border)."""
    right: tuple[Segment, ...]
    """The right border's segments, filtered."""
    filters: tuple[LineFilter, ...]
    """The app's enabled line filters, in the order Textual applies them."""
    background: Color
    """The widget's background, which the filters are given."""
    matches: bool = True
    """Whether the row put together here was Textual's row exactly, segment for segment; if not, the frame is not
    used."""

    def row(self, content: Strip, offsets: tuple[int, int] | None) -> Strip:
        """Content row `content` (content-width cells, no offsets yet) as the pipeline draws it, with selection
        `offsets` (x, y) applied after the filters, as Textual applies them before."""
        for line_filter in self.filters:
            content = content.apply_filter(line_filter, self.background)
        if offsets is not None:
            content = content.apply_offsets(*offsets)
        return Strip([*self.left, *content, *self.right], self.width)


def learn_frame(widget: Widget, key: tuple[Any, ...], drawn: Strip, content: Strip,
                offsets: tuple[int, int] | None) -> RowFrame:
    """The frame of `widget` in state `key`, from `drawn`, the first content row as Textual drew it from `content`
    (and `offsets`); `matches` says whether putting that row together here gives `drawn` again."""
    styles = widget.styles
    gutter, height = styles.gutter, widget.region.height
    (_top, _tc), (right, _rc), (_bottom, _bc), (left, _lc) = styles.border
    segments = list(drawn)
    lefts, rights = (1 if left else 0), (1 if right else 0)
    _base, background = widget.background_colors
    frame = RowFrame(key, range(gutter.top, height - gutter.bottom), widget.region.width,
                     tuple(segments[:lefts]), tuple(segments[len(segments) - rights:]),
                     tuple(widget.app.get_line_filters()), background)
    mine = frame.row(content, offsets)
    if mine != drawn or mine.cell_length != drawn.cell_length:
        return RowFrame(key, frame.rows, frame.width, (), (), (), background, matches=False)
    return frame
