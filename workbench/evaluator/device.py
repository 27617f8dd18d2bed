"""Choose the evaluation device without importing torch in the calling process."""

from __future__ import annotations

import os
import shutil

from workbench.evaluator.errors import EvalUsageError

DEVICES = ("auto", "cpu", "cuda")


def cuda_probably_available() -> bool:
    """A cheap guess: an NVIDIA driver tool on PATH and CUDA_VISIBLE_DEVICES not hiding every GPU.

    The harness checks torch.cuda.is_available() itself and turns a wrong guess into a usage error.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return shutil.which("nvidia-smi") is not None


def resolve_device(device: str) -> str:
    """Map "auto" | "cpu" | "cuda" to "cpu" or "cuda".

    Raises:
        EvalUsageError: an unknown device name.
    """
    if device not in DEVICES:
        raise EvalUsageError(f"unknown device {device!r} (use {', '.join(DEVICES)})")
    if device == "auto":
        return "cuda" if cuda_probably_available() else "cpu"
    return device
