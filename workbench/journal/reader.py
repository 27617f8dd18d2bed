"""Readers of a journal: a one-shot read, and a follower that tails the file beside a live writer."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Iterator

from workbench.journal.chain import Scan, iter_lines, start_chain
from workbench.journal.errors import JournalCorrupt, JournalError
from workbench.journal.record import Anchor, Event, NotJson


def _usable(anchor: Anchor | None, start_seq: int) -> Anchor | None:
    # An anchor skips the lines up to its seq, so it only helps when none of them is wanted.
    return anchor if anchor is not None and anchor.seq < start_seq else None


def read_events(
    path: Path,
    *,
    start_seq: int = 1,
    verify: bool = True,
    verified_upto: Anchor | tuple[int, int, str] | dict | None = None,
) -> Iterator[Event]:
    """Yield the events with seq >= start_seq, checking the whole chain up to the end of the file.

    Never writes: a torn final line (a crash, or a live writer mid-line) is skipped, not cut.

    Args:
        path: the events.jsonl file.
        start_seq: first seq to yield; earlier lines are still checked (cheaply, from fixed fields).
        verify: check the hash chain; off, only seq contiguity, JSON and types are checked.
        verified_upto: an anchor from a checkpoint; when it checks out and lies before start_seq,
            reading starts at its byte offset instead of the beginning (see Anchor).

    Raises:
        JournalCorrupt: a real break (raised when the iteration reaches it).
        JournalError: no such file.
    """
    path = Path(path)
    anchor = _usable(Anchor.coerce(verified_upto), start_seq)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise JournalError(f"{path}: no journal here") from None
    with f:
        chain, _ = start_chain(f, path, anchor, verify=verify)
        yield from Scan(f, chain).events(start_seq, want_events=True)


def follow(
    path: Path,
    *,
    start_seq: int = 1,
    stop: threading.Event | None = None,
    poll_s: float = 0.1,
    verify: bool = True,
    verified_upto: Anchor | tuple[int, int, str] | dict | None = None,
) -> Iterator[Event]:
    """Yield events from start_seq on, then new ones as a writer appends them, until `stop` is set.

    Waits for the file to appear. An incomplete last line is not an error here: it is re-read on
    the next poll, by which time the writer has usually finished it, or a new writer has cut it.

    Args:
        path: the events.jsonl file.
        start_seq: first seq to yield.
        stop: ends the iteration (checked after each batch and while waiting); None follows forever.
        poll_s: pause between looks at an unchanged file.
        verify: as in read_events.
        verified_upto: as in read_events.

    Raises:
        JournalCorrupt: a break that is still there on a second look.
        JournalError: the file shrank below what was already read (it was replaced or rewritten).
    """
    path = Path(path)
    anchor = _usable(Anchor.coerce(verified_upto), start_seq)
    f = None
    while f is None:
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            if _wait(stop, poll_s):
                return
    with f:
        chain, _ = start_chain(f, path, anchor, verify=verify)
        suspect: tuple[int, str] | None = None
        while True:
            if stop is not None and stop.is_set():
                return
            size = os.fstat(f.fileno()).st_size
            if size < chain.offset:
                raise JournalError(f"{path}: the file shrank below byte {chain.offset}, which was already read")
            advanced = False
            try:
                for raw, end, last in iter_lines(f, chain.offset):
                    if end is None:
                        break
                    line = chain.seq + 1
                    try:
                        event = chain.accept(raw, end, want_event=line >= start_seq)
                    except NotJson:
                        if last:
                            break
                        raise JournalCorrupt(path, line, "not valid JSON, and complete lines follow it") from None
                    advanced = True
                    if event is not None:
                        yield event
                suspect = None
            except JournalCorrupt as exc:
                # A read can overlap a new writer cutting a torn tail and appending after it; a real
                # break is still there on the next look, a race is not.
                if suspect == (chain.offset, str(exc)):
                    raise
                suspect = (chain.offset, str(exc))
                advanced = False
            if not advanced and _wait(stop, poll_s):
                return


def _wait(stop: threading.Event | None, seconds: float) -> bool:
    """Sleep, waking early when stop is set; True when it is."""
    if stop is None:
        time.sleep(seconds)
        return False
    return stop.wait(seconds)
