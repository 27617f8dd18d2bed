"""Length-prefixed JSON frames over inherited pipe fds (tensors travel beside them, through slab.py)."""

from __future__ import annotations

import fcntl
import json
import os
import struct
from typing import Any

HEADER = struct.Struct(">Q")
"""Every frame is an 8-byte big-endian payload length, then the payload."""

PIPE_BYTES = 1 << 20
"""Pipe capacity we ask Linux for: fewer context switches when tensors travel."""

_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class WireError(Exception):
    """A torn, oversized or unreadable frame: the other side died mid-write or is not following the protocol."""


def widen(fd: int) -> None:
    """Ask for a larger pipe buffer; harmless when the kernel refuses."""
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_frame(fd: int, payload: bytes | memoryview) -> None:
    """Write one frame; blocks until the reader has taken it all (pipes give back-pressure)."""
    _write_all(fd, HEADER.pack(len(memoryview(payload).cast("B"))))
    _write_all(fd, payload)


def _read_exact(fd: int, n: int) -> bytearray | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        chunk = os.readv(fd, [view[got:]])
        if chunk == 0:
            if got == 0:
                return None
            raise WireError(f"pipe closed after {got} of {n} bytes")
        got += chunk
    return buf


def read_frame(fd: int, limit: int) -> bytearray | None:
    """Read one frame; None on a clean end of stream (the writer exited between frames).

    Raises:
        WireError: a frame cut short or larger than `limit` bytes.
    """
    head = _read_exact(fd, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    if size > limit:
        raise WireError(f"frame of {size} bytes exceeds the {limit}-byte limit")
    if size == 0:
        return bytearray()
    body = _read_exact(fd, size)
    if body is None:
        raise WireError("pipe closed between a frame header and its body")
    return body


def dump_json(obj: Any) -> bytes:
    """JSON bytes for a frame; NaN and inf are kept (Python's JSON reads them back)."""
    return json.dumps(obj, default=str).encode("utf-8")


class FrameReader:
    """Incremental frame parser for a non-blocking reader (the parent polls the harness pipe with a deadline)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes read from the pipe; return every frame now complete.

        Raises:
            WireError: a frame larger than the limit.
        """
        self._buf += data
        frames = []
        while len(self._buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf)
            if size > self.limit:
                raise WireError(f"frame of {size} bytes exceeds the {self.limit}-byte limit")
            end = HEADER.size + size
            if len(self._buf) < end:
                break
            frames.append(bytes(self._buf[HEADER.size:end]))
            del self._buf[:end]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame still buffered (non-zero at EOF means the writer died mid-frame)."""
        return len(self._buf)


def encode_status(code: int) -> bytes:
    """A forked child's exit status (Popen's convention: -N for signal N) as the template's status-socket message."""
    return json.dumps({"status": code}).encode()


def decode_status(data: bytes) -> int:
    """The exit status in a status-socket message."""
    return int(json.loads(data)["status"])
