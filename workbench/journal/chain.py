"""Reading a journal line by line and checking that each line continues the one before it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from workbench.journal.errors import JournalCorrupt
from workbench.journal.record import START, Anchor, Event, NotJson, check_type, decode, line_hash, peek

CHUNK = 8 << 20
"""Read size: large enough that a 100 MB journal is a dozen reads, small enough to stay cheap in memory."""


def iter_lines(f: BinaryIO, offset: int) -> Iterator[tuple[bytes, int | None, bool]]:
    """Yield (line without newline, offset past its newline or None if it has none, is_last) from offset.

    The one-line lookahead is what lets callers tell a torn final line from damage in the middle.
    Only line-sized pieces are copied: a chunk is split once and a line cut by a chunk boundary is
    joined from its pieces, so a 100 MB journal costs one pass over its bytes.
    """
    f.seek(offset)
    pos = offset
    pending: list[bytes] = []
    held: tuple[bytes, int] | None = None
    while data := f.read(CHUNK):
        parts = data.split(b"\n")
        if len(parts) == 1:
            pending.append(data)
            continue
        if pending:
            pending.append(parts[0])
            parts[0] = b"".join(pending)
            pending = []
        rest = parts.pop()
        if rest:
            pending.append(rest)
        for raw in parts:
            pos += len(raw) + 1
            if held is not None:
                yield held[0], held[1], False
            held = (raw, pos)
    if pending:
        if held is not None:
            yield held[0], held[1], False
        yield b"".join(pending), None, True
    elif held is not None:
        yield held[0], held[1], True


class Chain:
    """The running check of one journal: the seq and the prev hash the next line must carry."""

    __slots__ = ("path", "seq", "hash", "offset", "verify", "_unparsed")

    def __init__(self, path: Path, anchor: Anchor = START, *, verify: bool = True) -> None:
        self.path = path
        """The journal, for messages."""
        self.seq = anchor.seq
        """Seq of the last accepted line (0 before the first)."""
        self.hash = anchor.hash
        """sha256 of the last accepted line (kept current only when verify is on)."""
        self.offset = anchor.offset
        """Byte offset just past the last accepted line."""
        self.verify = verify
        """Check prev against the hash of the line before; off, only seq and type are checked."""
        self._unparsed: bytes | None = None

    def anchor(self) -> Anchor:
        """Where the chain stands, as an anchor for a later resume."""
        return Anchor(self.seq, self.offset, self.hash)

    def accept(self, raw: bytes, end: int, *, want_event: bool) -> Event | None:
        """Check one complete line and advance past it.

        Args:
            raw: the line without its newline.
            end: its end offset (past the newline).
            want_event: parse the whole line into an Event; otherwise only the seq, type and prev
                fields are read where the layout allows, since the hash already covers the rest.

        Returns:
            The Event when want_event, else None.

        Raises:
            NotJson: the line does not decode (the caller decides: torn tail or corruption).
            JournalCorrupt: seq gap, unknown type or broken hash chain.
        """
        line = self.seq + 1
        event = None
        fields = None if want_event else peek(raw)
        if fields is None:
            event = decode(raw, self.path, line)
            fields = (event.seq, event.type, event.prev)
        seq, etype, prev = fields
        if seq != line:
            if seq > line:
                problem = f"seq gap: expected seq {line}, found {seq} (lines are missing before this one)"
            else:
                problem = f"seq out of order: expected seq {line}, found {seq}"
            raise JournalCorrupt(self.path, line, problem)
        check_type(etype, self.path, line)
        if self.verify:
            if prev != self.hash:
                self._blame_unparsed(line - 1)
                if line == 1:
                    problem = "hash chain broken: the first line must have prev ''"
                else:
                    problem = (
                        f"hash chain broken: prev is not the sha256 of line {line - 1} "
                        f"(line {line - 1} or this line was altered)"
                    )
                raise JournalCorrupt(self.path, line, problem)
            self.hash = line_hash(raw)
        self.seq = line
        self.offset = end
        self._unparsed = raw if event is None else None
        return event

    def _blame_unparsed(self, line: int) -> None:
        # The previous line was checked from its fixed fields only; if it is not even JSON, that is
        # the more precise report (and the one read_events, which parses every line, would give).
        if self._unparsed is None:
            return
        try:
            decode(self._unparsed, self.path, line)
        except NotJson:
            raise JournalCorrupt(self.path, line, "not valid JSON, and complete lines follow it") from None


@dataclass(frozen=True)
class Torn:
    """A final line that was never acknowledged: no newline, or not JSON."""

    offset: int
    """Where it starts (the length the file is cut to)."""
    line: int
    """Its line number."""
    size: int
    """Its length in bytes, newline included."""
    reason: str
    """'no newline at the end' or 'not valid JSON'."""


class Scan:
    """One pass over a journal from a chain's position; `torn` is set if the last line is torn."""

    def __init__(self, f: BinaryIO, chain: Chain) -> None:
        self.f = f
        """The open journal."""
        self.chain = chain
        """Advanced as lines are accepted."""
        self.torn: Torn | None = None
        """The torn final line, known once events() is exhausted."""

    def lines(self, want: Callable[[bytes], bool]) -> Iterator[tuple[bytes, Event | None]]:
        """Check every line to the end; yield each complete line with its Event, decoded only where want(raw)
        says so (and always for the last line, which no successor's prev vouches for).

        For readers that pick events by a cheap look at the raw line (the history skips bulky types).

        Raises:
            JournalCorrupt: a real break (anything but a torn final line).
        """
        chain = self.chain
        for raw, end, last in iter_lines(self.f, chain.offset):
            line = chain.seq + 1
            if end is None:
                self.torn = Torn(chain.offset, line, len(raw), "no newline at the end")
                return
            try:
                event = chain.accept(raw, end, want_event=want(raw) or last)
            except NotJson:
                if last:
                    self.torn = Torn(chain.offset, line, len(raw) + 1, "not valid JSON")
                    return
                raise JournalCorrupt(chain.path, line, "not valid JSON, and complete lines follow it") from None
            yield raw, event

    def events(self, start_seq: int, *, want_events: bool) -> Iterator[Event]:
        """Check every line to the end; yield those with seq >= start_seq when want_events.

        Raises:
            JournalCorrupt: a real break (anything but a torn final line).
        """
        wanted = (lambda raw: self.chain.seq + 1 >= start_seq) if want_events else (lambda raw: False)
        for _, event in self.lines(wanted):
            if want_events and event is not None and event.seq >= start_seq:
                yield event


def check_anchor(f: BinaryIO, anchor: Anchor) -> str | None:
    """None when the anchor still describes this file; otherwise why it does not.

    Only the anchor's own line is re-read and hashed, which is what makes resuming cheap.
    """
    if anchor.seq == 0:
        return None
    size = os.fstat(f.fileno()).st_size
    if anchor.offset > size:
        return f"the journal ({size} bytes) ends before the anchor at byte {anchor.offset}"
    f.seek(anchor.offset - 1)
    if f.read(1) != b"\n":
        return f"no line ends at byte {anchor.offset}"
    pieces: list[bytes] = []
    pos = anchor.offset - 1
    while pos > 0:
        n = min(1 << 16, pos)
        f.seek(pos - n)
        block = f.read(n)
        nl = block.rfind(b"\n")
        if nl >= 0:
            pieces.append(block[nl + 1 :])
            break
        pieces.append(block)
        pos -= n
    raw = b"".join(reversed(pieces))
    if line_hash(raw) != anchor.hash:
        return f"the line ending at byte {anchor.offset} no longer has the anchor's hash"
    fields = peek(raw)
    if fields is None:
        try:
            fields = (decode(raw, Path("?"), anchor.seq).seq, "", "")
        except (NotJson, JournalCorrupt):
            return f"the line ending at byte {anchor.offset} is not a journal record"
    if fields[0] != anchor.seq:
        return f"the line ending at byte {anchor.offset} has seq {fields[0]}, not {anchor.seq}"
    return None


def start_chain(f: BinaryIO, path: Path, anchor: Anchor | None, *, verify: bool) -> tuple[Chain, str | None]:
    """A chain starting at the anchor if it checks out, else at line 1; plus why the anchor was refused."""
    if anchor is None or anchor.seq == 0:
        return Chain(path, START, verify=verify), None
    refused = check_anchor(f, anchor)
    if refused is not None:
        return Chain(path, START, verify=verify), refused
    return Chain(path, anchor, verify=verify), None
