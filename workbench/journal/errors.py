"""Journal exceptions: one line each, naming the file and, where there is one, the line."""

from __future__ import annotations

import os
from pathlib import Path


class JournalError(Exception):
    """Base of every journal failure; str() is one line a person can act on."""


class JournalCorrupt(JournalError):
    """A complete line breaks the journal: hash chain, seq gap, bad JSON before the end, unknown type."""

    def __init__(self, path: Path, line: int, problem: str) -> None:
        self.path = Path(path)
        """The journal file."""
        self.line = line
        """1-based line where the check failed (line numbers equal seq numbers in a sound journal)."""
        self.problem = problem
        """What was wrong, without the location."""
        super().__init__(f"{self.path}:{line}: {problem}")


class JournalLocked(JournalError):
    """Another live process holds the writer lock of this journal."""

    def __init__(self, path: Path, pid: int | None, lock_path: Path) -> None:
        self.path = Path(path)
        """The journal file."""
        self.pid = pid
        """The holder's pid as it wrote it into the lock file (None when unreadable)."""
        if pid is None:
            holder = "a process whose pid is unknown"
        elif pid == os.getpid():
            holder = f"pid {pid}, this process: it is already open for writing"
        else:
            holder = f"pid {pid}"
        super().__init__(
            f"{self.path}: another writer holds {lock_path.name} ({holder}); "
            "stop it or open the session read-only"
        )
