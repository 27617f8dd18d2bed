"""A shared file mapping that carries tensor bytes between the harness and the worker, beside the JSON frames.

Pickling a 128 MB tensor into a pipe cost about 0.6 s per direction on the H200 box; writing it into a mapping
the other process already holds costs one device-to-host copy. Frames stay small JSON: each tensor in a message is
replaced by a descriptor naming its offset in the writer's slab. One slab per direction, owned by its writer;
the reader copies what it needs out before replying, so the writer may reuse the space for the next message.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

from workbench.plain import map_leaves

ALIGN = 64
"""Byte alignment of every tensor in a slab, enough for any dtype view."""

_GROW = 1.5
_KEY = "__slab__"


class SlabError(Exception):
    """A descriptor that points outside the slab or names an unknown dtype: the other side is misbehaving."""


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Slab:
    """One direction's shared mapping: the writer puts tensors in, the reader gets copies out."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._mm: mmap.mmap | None = None
        self._bytes: Any = None
        self._size = 0
        self.bytes_moved = 0
        """Bytes written or read through this slab, for the overhead report."""

    def _map(self, size: int) -> None:
        import torch

        if size <= self._size and self._bytes is not None:
            return
        if os.fstat(self._fd).st_size < size:
            os.ftruncate(self._fd, size)
        self._bytes = None  # older mappings stay valid until collected: a view taken from them is never reused
        self._mm = mmap.mmap(self._fd, size)
        self._bytes = torch.frombuffer(self._mm, dtype=torch.uint8)
        self._size = size

    def _view(self, offset: int, nbytes: int, dtype: Any, shape: list[int]) -> Any:
        return self._bytes[offset:offset + nbytes].view(dtype).view(shape)

    def pack(self, obj: Any) -> Any:
        """Return `obj` with every tensor written into the slab and replaced by a descriptor (JSON-safe)."""
        import torch

        tensors: list[torch.Tensor] = []

        def collect(value: Any) -> None:
            if isinstance(value, torch.Tensor):
                tensors.append(value)
            elif isinstance(value, dict):
                for v in value.values():
                    collect(v)
            elif isinstance(value, (list, tuple)):
                for v in value:
                    collect(v)

        collect(obj)
        need = sum(_align(t.numel() * t.element_size()) for t in tensors)
        if need > self._size:
            self._map(max(need, int(self._size * _GROW), ALIGN))
        offset = 0

        def put(value: Any) -> Any:
            nonlocal offset
            if not isinstance(value, torch.Tensor):
                return value
            t = value.detach()
            nbytes = t.numel() * t.element_size()
            if nbytes:
                self._view(offset, nbytes, t.dtype, list(t.shape)).copy_(t)
            desc = {_KEY: True, "offset": offset, "nbytes": nbytes, "dtype": str(t.dtype).removeprefix("torch."),
                    "shape": list(t.shape), "size": self._size}
            offset += _align(nbytes)
            self.bytes_moved += nbytes
            return desc

        return map_leaves(obj, put)

    def unpack(self, obj: Any, device: str = "cpu") -> Any:
        """Return `obj` with every descriptor replaced by a tensor copied out of the slab onto `device`.

        Raises:
            SlabError: a descriptor outside the mapping or with an unknown dtype.
        """
        import torch

        def replace(value: Any) -> Any:
            if isinstance(value, dict) and value.get(_KEY) is True:
                try:
                    offset, nbytes = int(value["offset"]), int(value["nbytes"])
                    shape = [int(s) for s in value["shape"]]
                    dtype = getattr(torch, str(value["dtype"]))
                    size = int(value["size"])
                except (KeyError, TypeError, ValueError, AttributeError) as exc:
                    raise SlabError(f"bad tensor descriptor ({exc})") from None
                if not isinstance(dtype, torch.dtype):
                    raise SlabError(f"bad tensor descriptor dtype {value['dtype']!r}")
                if os.fstat(self._fd).st_size < size or offset < 0 or offset + nbytes > size:
                    raise SlabError("tensor descriptor points outside the slab")
                numel = 1
                for s in shape:
                    numel *= s
                if numel * torch.empty((), dtype=dtype).element_size() != nbytes:
                    raise SlabError("tensor descriptor size does not match its shape and dtype")
                if nbytes == 0:
                    return torch.empty(shape, dtype=dtype, device=device)
                self._map(size)
                self.bytes_moved += nbytes
                view = self._view(offset, nbytes, dtype, shape)
                return view.to(device, copy=True)
            if isinstance(value, dict):
                return {k: replace(v) for k, v in value.items()}
            if isinstance(value, list):
                return [replace(v) for v in value]
            return value

        return replace(obj)

    def close(self) -> None:
        """Drop the mapping and the descriptor (the file itself belongs to the evaluation's private folder)."""
        self._bytes = None
        try:
            os.close(self._fd)
        except OSError:
            pass
