"""The journal's single writer: lock, verify, cut a torn tail, then append with fsync per event."""

from __future__ import annotations

import collections
import os
import threading
from pathlib import Path
from typing import Any

from workbench.journal import lock
from workbench.journal.chain import Scan, Torn, start_chain
from workbench.journal.errors import JournalError
from workbench.journal.events import EVENT_TYPES
from workbench.journal.files import Closing, fsync_dir
from workbench.journal.record import Anchor, Event, encode, line_hash, utc_now_ms

RECENT_ANCHORS = 4096
"""How many recent positions anchor_at() remembers (a checkpoint is taken at or near the tail)."""


class Journal(Closing):
    """The one process that may append to a session's events.jsonl.

    Every append is written with a single write() and fsync'd before it returns, so an event that
    was returned to the caller survives a crash; a crash mid-write leaves at most one torn final line,
    which the next open cuts. Use Journal.open(), not the constructor.
    """

    def __init__(
        self,
        path: Path,
        fd: int,
        lock_fd: int,
        position: Anchor,
        *,
        recovered: str | None,
        verified_from: int,
        anchor_note: str | None,
    ) -> None:
        self.path = path
        """The events.jsonl file."""
        self.recovered = recovered
        """One line describing the torn tail that open() cut, or None when the file was clean."""
        self.verified_from = verified_from
        """First seq whose line open() hashed: 1 after a full check, more when an anchor was used."""
        self.anchor_note = anchor_note
        """Why a verified_upto anchor given to open() was not used (None when used or not given)."""
        self.last_seq = position.seq
        """Seq of the last line on disk (0 for an empty journal)."""
        self.last_hash = position.hash
        """sha256 of the last line: the next append's prev."""
        self._offset = position.offset
        self._fd: int | None = fd
        self._lock_fd = lock_fd
        self._mutex = threading.Lock()
        self._failed: str | None = None
        self._recent: collections.deque[Anchor] = collections.deque([position], maxlen=RECENT_ANCHORS)

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        create: bool = False,
        verified_upto: Anchor | tuple[int, int, str] | dict | None = None,
    ) -> "Journal":
        """Lock, verify and recover a journal, ready to append.

        Args:
            path: the events.jsonl file.
            create: start an empty journal if the file does not exist (its folder must).
            verified_upto: an anchor from a checkpoint (Journal.anchor() at the time): the line it
                names is re-hashed and the bytes before it are trusted, so only the tail is read.
                A stale anchor falls back to a full check and says why in `anchor_note`.

        Raises:
            JournalLocked: another live process is the writer.
            JournalCorrupt: a real break in the chain (never cut: that is for a person to look at).
            JournalError: no such journal, or the file cannot be opened.
        """
        path = Path(path)
        anchor = Anchor.coerce(verified_upto)
        if not path.parent.is_dir():
            raise JournalError(f"{path}: folder {path.parent} does not exist")
        if not create and not path.exists():
            raise JournalError(f"{path}: no journal here")
        lock_fd = lock.acquire(path)
        try:
            existed = path.exists()
            try:
                fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError as exc:
                raise JournalError(f"{path}: cannot open: {exc.strerror}") from None
            try:
                if not existed:
                    fsync_dir(path.parent)
                with os.fdopen(fd, "rb", closefd=False) as f:
                    chain, anchor_note = start_chain(f, path, anchor, verify=True)
                    verified_from = chain.seq + 1
                    scan = Scan(f, chain)
                    for _ in scan.events(1, want_events=False):
                        pass
                recovered = _cut(path, fd, scan.torn, chain.seq) if scan.torn else None
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            lock.release(lock_fd)
            raise
        return cls(
            path,
            fd,
            lock_fd,
            chain.anchor(),
            recovered=recovered,
            verified_from=verified_from,
            anchor_note=anchor_note,
        )

    def append(self, type: str, data: dict[str, Any]) -> Event:
        """Write one event and fsync it; the returned Event is durable.

        Thread-safe. `data` is stored as given (the returned Event holds the same dict, not a copy).

        Raises:
            JournalError: unknown type, data that is not strict JSON (NaN and Infinity included), a
                closed journal, or a failed write (after which the journal refuses appends: reopen).
        """
        if type not in EVENT_TYPES:
            raise JournalError(f"{self.path}: unknown event type {type!r} (see workbench/journal/events.py)")
        with self._mutex:
            if self._fd is None:
                raise JournalError(f"{self.path}: the journal is closed")
            if self._failed is not None:
                raise JournalError(self._failed)
            seq, prev, ts = self.last_seq + 1, self.last_hash, utc_now_ms()
            try:
                raw = encode(seq, ts, type, data, prev)
            except ValueError as exc:
                raise JournalError(f"{self.path}: {exc}") from None
            line = memoryview(raw + b"\n")
            try:
                done = 0
                while done < len(line):
                    done += os.write(self._fd, line[done:])
                os.fsync(self._fd)
            except OSError as exc:
                self._fail(seq, exc)
            self.last_seq, self.last_hash = seq, line_hash(raw)
            self._offset += len(line)
            self._recent.append(Anchor(seq, self._offset, self.last_hash))
            return Event(seq, ts, type, data, prev)

    def _fail(self, seq: int, exc: OSError) -> None:
        # A half-written line would turn into corruption as soon as another line followed it, so
        # roll the file back to the last acknowledged line and stop accepting appends.
        try:
            os.ftruncate(self._fd, self._offset)
            os.fsync(self._fd)
            state = f"rolled back to seq {self.last_seq}"
        except OSError:
            state = "could not roll back; reopening will cut the torn tail"
        self._failed = (
            f"{self.path}: appending seq {seq} failed ({exc.strerror or exc}); {state}; "
            "the journal refuses further appends until reopened"
        )
        raise JournalError(self._failed) from None

    def anchor(self) -> Anchor:
        """The current end of the journal, for a checkpoint to pass back as verified_upto."""
        with self._mutex:
            return self._recent[-1]

    def anchor_at(self, seq: int) -> Anchor | None:
        """The anchor just past line `seq`, if it is among the recent ones this writer remembers."""
        with self._mutex:
            first = self._recent[0].seq
            if first <= seq <= self._recent[-1].seq:
                return self._recent[seq - first]
            return None

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._fd is None

    def close(self) -> None:
        """Release the file and the writer lock; idempotent. Appends were already durable."""
        with self._mutex:
            if self._fd is None:
                return
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            finally:
                lock.release(self._lock_fd)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"seq {self.last_seq}"
        return f"<Journal {self.path} {state}>"


def _cut(path: Path, fd: int, torn: Torn, last_seq: int) -> str:
    """Truncate a torn final line away, keeping its bytes in a sibling file for a post-mortem."""
    kept = _keep_torn(path, fd, torn)
    try:
        os.ftruncate(fd, torn.offset)
        os.fsync(fd)
    except OSError as exc:
        raise JournalError(f"{path}:{torn.line}: cannot cut the torn final line: {exc.strerror}") from None
    return (
        f"{path}:{torn.line}: cut a torn final line ({torn.size} bytes, {torn.reason}; {kept}); "
        f"events 1..{last_seq} are intact"
    )


def _keep_torn(path: Path, fd: int, torn: Torn) -> str:
    data = os.pread(fd, torn.size, torn.offset)
    for n in range(1, 1000):
        target = path.with_name(f"{path.name}.torn-{torn.line}" + (f".{n}" if n > 1 else ""))
        try:
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        except OSError as exc:
            return f"could not keep a copy: {exc.strerror}"
        try:
            os.write(out, data)
            os.fsync(out)
        except OSError as exc:
            return f"could not keep a copy: {exc.strerror}"
        finally:
            os.close(out)
        return f"bytes kept in {target.name}"
    return "could not keep a copy: too many earlier copies"
