"""A trivial Triton kernel a candidate process launches before its candidate is loaded, to pay Triton's set-up early.

The first Triton launch in a process costs seconds even with a warm kernel cache (3.9 s measured on the H200 box:
driver utilities, launcher and compiler modules). Paying it while the process waits for its candidate keeps it
out of the candidate's first call, and so out of that call's time limit.
"""

from __future__ import annotations

import triton
import triton.language as tl

@triton.jit
def _touch(ptr):
    tl.store(ptr, tl.load(ptr) + 1)


def touch(device: str) -> None:
    """Create the CUDA context and launch one trivial kernel; a broken Triton shows up, with its real error, at the
    candidate's own launch instead."""
    import torch

    try:
        torch.cuda.init()
        t = torch.zeros(1, dtype=torch.int32, device=device)
        _touch[(1,)](t)
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001
        pass
