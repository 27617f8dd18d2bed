"""Journal records: the Event dataclass, the exact bytes of a line, and anchors into a verified prefix."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from workbench.journal.errors import JournalCorrupt, JournalError
from workbench.journal.events import EVENT_TYPES

_KEYS = ("seq", "ts", "type", "data", "prev")

# The writer always emits keys in _KEYS order with json's default separators, so the fields that the
# chain needs sit at fixed places: a line can be checked without parsing the (possibly large) data.
_HEAD = re.compile(rb'\{"seq": (\d+), "ts": "[^"\\]*", "type": "([^"\\]*)", "data": ')
_HEX64 = re.compile(rb"[0-9a-f]{64}")
_PREV_OPEN = b', "prev": "'
_PREV_EMPTY = b', "prev": ""}'


@dataclass(frozen=True)
class Event:
    """One journal line: the seq-th thing that happened in a session."""

    seq: int
    """1, 2, 3, ... with no gaps; also the line number."""
    ts: str
    """UTC ISO-8601 with milliseconds and 'Z', e.g. '2026-11-29T22:13:17.123Z'."""
    type: str
    """One of EVENT_TYPES."""
    data: dict
    """The payload: plain JSON values."""
    prev: str
    """sha256 hex of the previous line's bytes without its newline ('' for seq 1)."""

    def to_dict(self) -> dict:
        """The event as the JSON object stored on its line."""
        return {"seq": self.seq, "ts": self.ts, "type": self.type, "data": self.data, "prev": self.prev}


@dataclass(frozen=True)
class Anchor:
    """A point in a journal up to which the lines were verified once: a resume checks only what follows.

    Lines 1..seq occupy bytes [0, offset) and line `seq` hashes to `hash`. Opening or reading with an
    anchor re-hashes that one line (so a journal rewritten since is noticed) and trusts the prefix
    before it; a stale or wrong anchor only costs a full verification, never a wrong answer.
    """

    seq: int
    """Last line of the verified prefix (0 for an empty prefix)."""
    offset: int
    """Byte offset just past that line's newline."""
    hash: str
    """sha256 hex of that line without its newline ('' when seq is 0)."""

    def to_dict(self) -> dict:
        """A TOML/JSON-safe form, as stored in a checkpoint."""
        return {"seq": self.seq, "offset": self.offset, "hash": self.hash}

    @classmethod
    def coerce(cls, value: Any) -> "Anchor | None":
        """Accept an Anchor, a (seq, offset, hash) sequence, a to_dict() mapping or None.

        Raises:
            JournalError: the value has the wrong shape (a hand-edited checkpoint, say).
        """
        if value is None or isinstance(value, Anchor):
            return value
        try:
            if isinstance(value, dict):
                seq, offset, digest = value["seq"], value["offset"], value["hash"]
            else:
                seq, offset, digest = value
        except (KeyError, TypeError, ValueError):
            raise JournalError(f"journal anchor {value!r} is not (seq, offset, hash)") from None
        ok = (
            isinstance(seq, int)
            and isinstance(offset, int)
            and isinstance(digest, str)
            and seq >= 0
            and offset >= 0
            and ((seq == 0 and offset == 0 and digest == "") or (seq > 0 and offset > 0 and len(digest) == 64))
        )
        if not ok:
            raise JournalError(f"journal anchor {value!r} is not (seq, offset, hash)")
        return cls(seq, offset, digest)


START = Anchor(0, 0, "")
"""The anchor of an empty journal: verification starts at line 1."""


def utc_now_ms() -> str:
    """Now, as the journal writes timestamps."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def line_hash(raw: bytes) -> str:
    """The chain hash of one line (bytes without the newline)."""
    return hashlib.sha256(raw).hexdigest()


def encode(seq: int, ts: str, etype: str, data: dict, prev: str) -> bytes:
    """The bytes of one line, without its newline.

    Strict JSON (no NaN or Infinity) so any tool can read the file. Non-ASCII text is kept as UTF-8
    to stay readable; json escapes every control character, so a line never holds a raw newline.

    Raises:
        ValueError: data is not a dict, or holds values JSON cannot represent.
    """
    if not isinstance(data, dict):
        raise ValueError(f"event data must be a dict, not {type_name(data)}")
    record = {"seq": seq, "ts": ts, "type": etype, "data": data, "prev": prev}
    try:
        return json.dumps(record, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (text decoded with surrogateescape, say) has no UTF-8 form; \u escapes do.
        return json.dumps(record, ensure_ascii=True, allow_nan=False).encode("ascii")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"event data for {etype!r} is not JSON: {exc}") from None


def type_name(value: Any) -> str:
    """A short type name for messages."""
    return type(value).__name__


class NotJson(Exception):
    """A line that does not decode: torn if it is the last line, corruption otherwise."""


def decode(raw: bytes, path: Path, line: int) -> Event:
    """Parse and shape-check one line.

    Raises:
        NotJson: the bytes are not a JSON document.
        JournalCorrupt: valid JSON that is not a journal record.
    """
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise NotJson() from None
    if not isinstance(obj, dict) or obj.keys() != set(_KEYS):
        keys = list(obj) if isinstance(obj, dict) else type_name(obj)
        raise JournalCorrupt(path, line, f"not a journal record (expected keys {list(_KEYS)}, got {keys})")
    seq, ts, typ, data, prev = obj["seq"], obj["ts"], obj["type"], obj["data"], obj["prev"]
    if not (
        type(seq) is int
        and isinstance(ts, str)
        and isinstance(typ, str)
        and isinstance(data, dict)
        and isinstance(prev, str)
    ):
        raise JournalCorrupt(path, line, "a field has the wrong type (seq int, ts/type/prev str, data object)")
    return Event(seq, ts, typ, data, prev)


def peek(raw: bytes) -> tuple[int, str, str] | None:
    """(seq, type, prev) of a line in the writer's own layout, without parsing its data; else None."""
    head = _HEAD.match(raw)
    if head is None:
        return None
    # prev is the last field, so it sits at a fixed distance from the end of the line.
    if raw.endswith(_PREV_EMPTY):
        prev, tail = "", len(_PREV_EMPTY)
    elif raw[-77:-66] == _PREV_OPEN and raw[-2:] == b'"}' and _HEX64.fullmatch(raw, len(raw) - 66, len(raw) - 2):
        prev, tail = raw[-66:-2].decode("ascii"), 77
    else:
        return None
    if head.end() + tail > len(raw):
        return None
    return int(head.group(1)), head.group(2).decode("ascii", "replace"), prev


def check_type(typ: str, path: Path, line: int) -> None:
    """Refuse a type outside the closed set (from a newer workbench, or damage)."""
    if typ not in EVENT_TYPES:
        raise JournalCorrupt(path, line, f"unknown event type {typ!r}")
