"""FLA chunk_kda as the KDA baseline; the only file of the task allowed to import fla (trusted process only)."""

import os

# Pin FLA to its own Triton path before it is imported: otherwise chunk_kda silently dispatches to FlashKDA
# (CUTLASS) or TileLang when those are installed, and we would be compared with a different kernel
# (HARNESS.md section 2).
os.environ["FLA_FLASH_KDA"] = "0"
os.environ["FLA_TILELANG"] = "0"

NAME = "fla.chunk_kda"

import torch

try:
    from fla.ops.kda import chunk_kda

    _WHY_NOT = ""
except Exception as exc:  # any import failure means "no baseline here", and the evaluator falls back to the reference
    chunk_kda = None
    _WHY_NOT = f"{type(exc).__name__}: {exc}".splitlines()[0]


def available() -> bool:
    """True when FLA imports and a CUDA device exists (its kernels do not run on the CPU)."""
    return chunk_kda is not None and torch.cuda.is_available()


def forward(q, k, v, g, beta, scale, initial_state):
    """Same semantics as reference.forward: returns (o, final_state fp32).

    Raises:
        RuntimeError: FLA did not import, or there is no CUDA device (one line, naming which).
    """
    if not available():
        raise RuntimeError(f"{NAME} is unavailable here: {_WHY_NOT or 'no CUDA device'}")
    o, final_state = chunk_kda(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=True
    )
    return o, final_state
