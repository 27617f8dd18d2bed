"""A trivial Triton kernel the candidate worker launches while the harness starts, to pay Triton's set-up early.

The first Triton launch in a process costs seconds even with a warm kernel cache (3.9 s measured on the H200 box:
driver utilities, launcher and compiler modules). Paying it in a background thread at start-up overlaps it with
the harness importing torch, instead of adding it to the candidate's first call.
"""

from __future__ import annotations

import threading

import triton
import triton.language as tl


@triton.jit
def _touch(ptr):
    tl.store(ptr, tl.load(ptr) + 1)


def _run(device: str) -> None:
    import torch

    try:
        t = torch.zeros(1, dtype=torch.int32, device=device)
        _touch[(1,)](t)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - a broken Triton shows up, with its real error, at the candidate's launch
        pass


def start(device: str) -> threading.Thread:
    """Begin the warm-up in a daemon thread; join it before any candidate code runs."""
    thread = threading.Thread(target=_run, args=(device,), name="triton-warmup", daemon=True)
    thread.start()
    return thread
