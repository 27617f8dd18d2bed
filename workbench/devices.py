"""Devices, decided without importing torch: which device a run uses, the GPU's name, and its roofline peaks.

The CLI, the evaluator and the agent runtime all choose a device here, so "auto" means the same everywhere; the
evaluator's trusted process then checks torch.cuda.is_available() itself and turns a wrong guess into a usage
error. The peak table is what a roofline floor, the profiler's roofline class and the bandwidth warnings read.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass

DEVICES = ("auto", "cpu", "cuda")
"""Device names a user may give."""


class DeviceError(ValueError):
    """An unknown device name; the evaluator reports it as a usage error."""


def _all_hidden() -> bool:
    """True when CUDA_VISIBLE_DEVICES hides every GPU ("" or "-1")."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible is not None and visible.strip() in ("", "-1")


def cuda_probably_available() -> bool:
    """A cheap guess: an NVIDIA driver tool on PATH and CUDA_VISIBLE_DEVICES not hiding every GPU."""
    return not _all_hidden() and shutil.which("nvidia-smi") is not None


def gpu_name() -> str | None:
    """The first NVIDIA GPU's name, or None where there is none (or CUDA_VISIBLE_DEVICES hides them all)."""
    if not cuda_probably_available():
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


def resolve_device(device: str) -> str:
    """Map "auto" | "cpu" | "cuda" to "cpu" or "cuda" ("auto" is a cheap guess: no nvidia-smi query).

    Raises:
        DeviceError: an unknown device name.
    """
    if device not in DEVICES:
        raise DeviceError(f"unknown device {device!r} (use {', '.join(DEVICES)})")
    if device == "auto":
        return "cuda" if cuda_probably_available() else "cpu"
    return device


# -- roofline peaks ------------------------------------------------------------------------------------------------

H200_MEASURED_COPY = 4.25e12
"""Bytes/s of a 1 GiB device-to-device copy on our H200 (HARNESS.md section 4)."""
H200_MEASURED_MATMUL = 672e12
"""FLOP/s of an 8192^3 bf16 matmul on our H200 (HARNESS.md section 4)."""
_REAL_BYTES = H200_MEASURED_COPY / 4.8e12
_REAL_FLOPS = H200_MEASURED_MATMUL / 989e12
"""What the H200 reaches of its datasheet: the derating used for GPUs we have not measured."""


@dataclass(frozen=True)
class Peaks:
    """One GPU model's ceilings: datasheet peaks (the hard floor) and realistic ones (what kernels can reach)."""

    gpu: str
    """The model, as the table names it ("H200")."""
    bytes_per_s: float
    """Datasheet memory bandwidth: a time under the floor it implies is impossible."""
    flops_per_s: float
    """Datasheet dense bf16 tensor-core rate."""
    real_bytes_per_s: float
    """Realistic bandwidth: measured on this model (H200) or the datasheet derated like the H200."""
    real_flops_per_s: float
    """Realistic compute rate, likewise."""
    measured: bool = False
    """True when the realistic figures were measured by us on this model."""
    known: bool = True
    """False for the stand-in used for a GPU the table does not know."""

    def describe(self) -> str:
        """'H200: 4.8 TB/s, 989 TFLOP/s (realistic 4.25 TB/s, 672 TFLOP/s, measured)'."""
        how = "measured" if self.measured else "derated datasheet"
        return (f"{self.gpu}: {self.bytes_per_s / 1e12:.3g} TB/s, {self.flops_per_s / 1e12:.4g} TFLOP/s (realistic "
                f"{self.real_bytes_per_s / 1e12:.3g} TB/s, {self.real_flops_per_s / 1e12:.4g} TFLOP/s, {how})")


def _spec(gpu: str, tb_s: float, tflop_s: float) -> Peaks:
    return Peaks(gpu, tb_s * 1e12, tflop_s * 1e12, tb_s * 1e12 * _REAL_BYTES, tflop_s * 1e12 * _REAL_FLOPS)


PEAKS: tuple[tuple[str, Peaks], ...] = (
    ("gh200", _spec("GH200", 4.9, 989)),
    ("h200 nvl", _spec("H200 NVL", 4.8, 835)),
    ("h200", Peaks("H200", 4.8e12, 989e12, H200_MEASURED_COPY, H200_MEASURED_MATMUL, measured=True)),
    ("h100 nvl", _spec("H100 NVL", 3.9, 835)),
    ("h100 pcie", _spec("H100 PCIe", 2.0, 756)),
    ("h100", _spec("H100 SXM", 3.35, 989)),
    ("h800 pcie", _spec("H800 PCIe", 2.0, 756)),
    ("h800", _spec("H800 SXM", 3.35, 989)),
    ("h20", _spec("H20", 4.0, 148)),
    ("gb200", _spec("GB200", 8.0, 2500)),
    ("b200", _spec("B200", 8.0, 2250)),
    ("a100", _spec("A100", 2.039, 312)),
    ("a800", _spec("A800", 2.039, 312)),
    ("l40s", _spec("L40S", 0.864, 362)),
)
"""Substring of the lower-case device name -> peaks, most specific first ("h200 nvl" before "h200"). Where a
model comes in several memory configurations the fastest is listed, so no floor is ever too high."""

UNKNOWN_PEAKS = Peaks(
    "unknown GPU", max(p.bytes_per_s for _, p in PEAKS), max(p.flops_per_s for _, p in PEAKS),
    max(p.real_bytes_per_s for _, p in PEAKS), max(p.real_flops_per_s for _, p in PEAKS), known=False)
"""For a GPU the table does not know: the largest known peaks, so its floors are low but never wrongly high."""


@functools.lru_cache(maxsize=64)
def peaks_for(name: str | None) -> Peaks:
    """The peaks of a GPU named as torch or nvidia-smi name it ("NVIDIA H200"); UNKNOWN_PEAKS when not listed."""
    low = (name or "").lower()
    for key, peaks in PEAKS:
        if key in low:
            return peaks
    return UNKNOWN_PEAKS
