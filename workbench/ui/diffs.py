"""Unified diffs between two kernel revisions: plain text, shared by the diff pane and the Markdown report."""

from __future__ import annotations

import difflib


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        # As diff(1) does, so a missing final newline shows up instead of gluing two lines together.
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def unified(old: str, new: str, old_label: str, new_label: str, *, context: int = 3) -> str:
    """The unified diff turning `old` into `new`; '' when they are the same text.

    Args:
        old: the earlier revision (the parent, the best, the marked attempt).
        new: the revision being looked at.
        old_label: the '---' file name, e.g. 'attempt 4 (parent)'.
        new_label: the '+++' file name.
        context: unchanged lines kept around each change.
    """
    return "".join(difflib.unified_diff(_lines(old), _lines(new), fromfile=old_label, tofile=new_label, n=context))


def counts(diff: str) -> tuple[int, int]:
    """(lines added, lines removed) in a unified diff, not counting its two header lines."""
    added = removed = 0
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed
