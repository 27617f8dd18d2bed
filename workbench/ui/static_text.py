"""update_static: replace a Static's text, asking for a screen layout pass only when its size can change."""

from __future__ import annotations

from rich.cells import cell_len
from textual.content import Content
from textual.widgets import Static


def update_static(static: Static, content: Content | str, *, auto_width: bool = False, one_line: bool = False) -> None:
    """Update `static`, laying the screen out again only if the new text may change the widget's size.

    Static.update asks for a layout pass of the whole screen every time, and one pass followed by a full repaint
    cost tens of milliseconds per tick under a burst of events (most of the live screen's work). The size can
    change only when the number of lines changes, when a line no longer fits the width (it would wrap), or, for a
    width: auto Static, when the widest line changes width.

    Args:
        static: the widget.
        content: its new text.
        auto_width: the Static's width follows its text (one-line status pieces), so width changes need layout.
        one_line: the Static is styled `height: 1; text-wrap: nowrap` (a bar), so a long line is cropped, not
            wrapped, and only an auto width can change its size.
    """
    plain = content.plain if isinstance(content, Content) else content
    widths = [cell_len(line) for line in plain.split("\n")]
    widest = max(widths)
    fits = one_line or static.size.width == 0 or widest <= static.content_size.width
    shape = (len(widths), widest if auto_width else None, fits)
    previous = getattr(static, "_workbench_shape", None)
    static._workbench_shape = shape  # type: ignore[attr-defined]
    static.update(content, layout=not fits or shape != previous)
