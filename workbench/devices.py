"""Which device a run defaults to, decided without importing torch (the CLI must start fast)."""

from __future__ import annotations

import os
import shutil
import subprocess


def gpu_name() -> str | None:
    """The first NVIDIA GPU's name, or None where there is none (or CUDA_VISIBLE_DEVICES hides them all)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return None
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return names[0] if out.returncode == 0 and names else None


def default_device() -> str:
    """'cuda' when a GPU is visible, otherwise 'cpu' (the Triton interpreter on small shapes)."""
    return "cuda" if gpu_name() else "cpu"
