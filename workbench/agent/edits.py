"""The session's kernel.py: the current kernel for the person to edit in their own editor, and their edits taken in.

The runtime rewrites kernel.py with every new attempt and checks it at step boundaries; text it did not write is
a person's edit and becomes a human attempt (even one equal to an older attempt: going back to it says "build on
this"). Two things are not edits: an empty file (an editor half-way through a save), and, on the first look after
a resume, the text of the attempt before the current one, which a crash between journaling an attempt and
rewriting kernel.py leaves behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.agent.tunables import TunablesError, read_declared
from workbench.session.atomic import write_text_atomic
from workbench.session.revisions import sha256_text
from workbench.session.state import SessionState


class WorkingCopyError(Exception):
    """kernel.py exists but cannot be read; one line for the journal."""


@dataclass(frozen=True)
class HumanEdit:
    """What a person saved in kernel.py: the new source and the tunables it declares."""

    source: str
    params: dict[str, Any]


class WorkingCopy:
    """sessions/<id>/kernel.py, written by the runtime, edited by the person."""

    def __init__(self, path: Path, state: SessionState) -> None:
        current = state.current
        previous = state.attempts.get(current.n - 1) if current is not None else None
        self.path = path
        """The file."""
        self.written_sha = current.sha256 if current is not None else ""
        """sha256 of what the runtime last wrote there (on resume: the current attempt, as it would have)."""
        self._stale_sha = previous.sha256 if previous is not None else ""
        """Until the first look: the text a crash mid-step would have left there."""

    def _read(self) -> str | None:
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkingCopyError(f"kernel.py: unreadable ({exc})") from None

    def _pending(self) -> bool:
        """Whether the file holds an edit not taken yet."""
        try:
            text = self._read()
        except WorkingCopyError:
            return False
        return bool(text and text.strip()) and sha256_text(text or "") != self.written_sha

    def write(self, source: str) -> None:
        """Show a new current kernel, unless a person's edit not yet taken is there (it becomes the next attempt)."""
        if not self._pending():
            self._replace(source)

    def _replace(self, source: str) -> None:
        write_text_atomic(self.path, source)  # an editor never reads half a kernel
        self.written_sha = sha256_text(source)

    def take(self, state: SessionState) -> HumanEdit | None:
        """The person's edit since the last look, or None; a missing or stale file is rewritten from the state.

        Raises:
            WorkingCopyError: the file cannot be read.
        """
        current = state.current
        stale, self._stale_sha = self._stale_sha, ""
        text = self._read()
        if text is None or (stale and sha256_text(text) == stale):
            if current is not None:
                self._replace(current.source)
            return None
        sha = sha256_text(text)
        if sha == self.written_sha or (current is not None and sha == current.sha256) or not text.strip():
            self.written_sha = sha
            return None
        try:  # record the tunables the edit declares, so the tuner does not re-try them
            params = read_declared(text).config
        except TunablesError:
            params = {}
        return HumanEdit(text, params)
