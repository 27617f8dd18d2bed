"""The event log: an append-only, hash-chained, fsync'd JSON-lines journal with one writer.

Durability: Journal.append writes one whole line with one write() and fsyncs it before returning,
so a returned Event survives a crash of the process or the machine. A crash mid-write leaves at
most one torn final line (no newline, or not JSON); the next Journal.open cuts it, keeps its bytes
in events.jsonl.torn-<line> and says so in `recovered`. Anything else that breaks the chain (a
changed byte, a missing or repeated line, an unknown type) is JournalCorrupt with its line number
and is never cut. Readers (read_events, follow) take no lock and never write.

Fast resume: verifying means hashing every line (sha256, about 0.25 s per 100 MB here). A
checkpoint stores Journal.anchor(), an Anchor (seq, byte offset, hash of that line); passing it
back as verified_upto re-hashes that one line and reads only the bytes after it, so resume cost
follows the tail, not the session's length. The trade-off: damage inside the anchored prefix is
found by a full read (read_events without an anchor, e.g. review), not by a resume.
"""

from workbench.journal.errors import JournalCorrupt, JournalError, JournalLocked
from workbench.journal.events import EVENT_TYPES, EVENTS_VERSION
from workbench.journal.journal import Journal
from workbench.journal.reader import follow, read_events
from workbench.journal.record import Anchor, Event

__all__ = [
    "EVENT_TYPES",
    "EVENTS_VERSION",
    "Anchor",
    "Event",
    "Journal",
    "JournalCorrupt",
    "JournalError",
    "JournalLocked",
    "follow",
    "read_events",
]
