"""Candidate inputs: made by the task's make_inputs on each side and compared by fingerprint, not shipped.

make_inputs is deterministic in (shape, seed, device), so the harness and the worker can each draw the same
tensors on the GPU instead of copying hundreds of megabytes between processes. The worker reports a fingerprint
of what it drew; the harness compares it with its own, so a candidate that altered make_inputs (to time on easy
inputs) is caught. Expected outputs never leave the harness either way.
"""

from __future__ import annotations

from typing import Any

import torch

_MIX = 0x9E3779B97F4A7C15 - (1 << 64)
"""An odd 64-bit constant (as a signed int64) that spreads element positions over the weight space."""


def tensor_fingerprint(t: torch.Tensor) -> str:
    """A position-sensitive checksum of a tensor's bytes, computed where the tensor lives.

    Two int64 sums with wrap-around arithmetic: additions modulo 2**64 are associative and commutative, so the
    result does not depend on the order a GPU reduction happens to use.
    """
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = (-flat.numel()) % 4
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    words = flat.view(torch.int32).to(torch.int64)
    index = torch.arange(1, words.numel() + 1, device=words.device, dtype=torch.int64)
    plain = int(words.sum())
    weighted = int((words * (index * _MIX)).sum())
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}:{plain & 0xFFFFFFFFFFFFFFFF:x}:{weighted & 0xFFFFFFFFFFFFFFFF:x}"


def fingerprint(inputs: dict[str, Any]) -> dict[str, str]:
    """Fingerprints of every input: tensors by content, other values by repr."""
    return {k: tensor_fingerprint(v) if isinstance(v, torch.Tensor) else f"value:{v!r}" for k, v in inputs.items()}


def clone(inputs: dict[str, Any]) -> dict[str, Any]:
    """An independent copy of an input dict (tensors cloned, other values shared: they are immutable scalars)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def refill(dst: dict[str, Any], src: dict[str, Any]) -> None:
    """Write src's tensor values into dst's buffers in place, so a call sees new data at the same addresses."""
    for k, v in src.items():
        if isinstance(v, torch.Tensor):
            dst[k].copy_(v)


def same(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Names of the inputs whose bits differ between two dicts of the same structure."""
    changed = []
    for k, v in b.items():
        x = a.get(k)
        if isinstance(v, torch.Tensor) and isinstance(x, torch.Tensor):
            if (x.dtype != v.dtype or x.shape != v.shape or
                    not torch.equal(x.detach().reshape(-1).view(torch.uint8), v.detach().reshape(-1).view(torch.uint8))):
                changed.append(k)
        elif x != v:
            changed.append(k)
    return changed


def subset_index(numel: int, seed: int, k: int = 1 << 16) -> torch.Tensor:
    """The positions a spot check compares: all of them for small outputs, else k drawn from a seeded generator.

    Both processes draw the same positions from the same seed (on the CPU generator, which is exact everywhere).
    """
    if numel <= k:
        return torch.arange(numel)
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, numel, (k,), generator=gen)
