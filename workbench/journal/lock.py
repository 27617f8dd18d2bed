"""The one-writer rule: an advisory flock on 'events.lock' beside the journal, holding the writer's pid."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from workbench.journal.errors import JournalError, JournalLocked

LOCK_NAME = "events.lock"
"""The lock file's name, in the journal's folder."""


def acquire(journal: Path) -> int:
    """Take the writer lock for `journal` and return its fd; close that fd to release.

    flock belongs to the open file, so the kernel drops it when the holder dies, however it dies:
    a lock file left by a crashed writer is harmless and the next writer simply takes it. The fd is
    not inherited by child processes (PEP 446), so an evaluator subprocess cannot keep it alive.

    Raises:
        JournalLocked: another open file holds it (a live process, or this one opening twice).
        JournalError: the lock file cannot be created.
    """
    lock_path = journal.parent / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise JournalError(f"{lock_path}: cannot open the writer lock: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _read_pid(fd)
        os.close(fd)
        raise JournalLocked(journal, pid, lock_path) from None
    except OSError as exc:
        os.close(fd)
        raise JournalError(f"{lock_path}: cannot take the writer lock: {exc.strerror}") from None
    # The pid is for messages only; the lock itself is the flock, so no fsync is needed here.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        return int(text) if text else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def release(fd: int) -> None:
    """Drop the lock; the pid is cleared first, while still held, so it never names a dead writer."""
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)
