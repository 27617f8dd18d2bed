"""Kernel revisions as text: the hash that names one and the unified diff between two.

One home for both, since the store (attempts/NNNN/diff.patch), the agent's tools and prompts, the TUI's diff pane
and the Markdown report all speak of the same revisions.
"""

from __future__ import annotations

import difflib
import hashlib


def sha256_text(text: str) -> str:
    """Hex sha256 of text as UTF-8: ties every result to the exact code evaluated."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        # As diff(1) does, so a missing final newline shows up instead of gluing two lines together, and a patch
        # stays line-oriented and still applies.
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


def changed(old: str, new: str) -> tuple[int, int]:
    """(lines added, lines removed) turning `old` into `new`."""
    return counts(unified(old, new, "a", "b", context=0))
