"""Roofline classification of one timed shape: memory-, compute-, latency- or launch-bound, and how far from the roof.

FLOPs and bytes come from the task's formulas (never from the kernel), the time from the evaluator. Two sets of
ceilings per GPU model (workbench.devices.PEAKS): "realistic" ones (on the H200 measured by us: a device copy, a bf16
matmul) and the "hard" datasheet ones.
"""

from __future__ import annotations

from typing import Any

from workbench.devices import Peaks

BOUND_FRACTION = 0.3
"""Below this fraction of the realistic roofline neither unit is the limit: the kernel waits (latency-bound)."""
LAUNCH_MS = 0.012
"""Kernels shorter than this are dominated by launch and ramp-up, whatever their roofline says."""
LAUNCH_WALL_RATIO = 2.0
"""When an eager call's host wall time is this many times its GPU time, launch overhead is what callers see."""


def classify(flops: float, nbytes: float, ms: float, *, peaks: Peaks, wall_ms: float | None = None) -> dict[str, Any]:
    """Classify one shape's measured time against the roofline.

    Args:
        flops: useful floating-point operations of the shape (task formula).
        nbytes: the fewest bytes the shape must move (task formula).
        ms: measured GPU time per call (the evaluator's event median).
        peaks: the GPU's ceilings (workbench.devices.peaks_for).
        wall_ms: eager host wall time per call, when known (launch overhead shows there).

    Returns:
        {"bound": "memory" | "compute" | "latency" | "launch", "limit": "memory" | "compute" (the unit the
        roofline names), "intensity" (FLOP/byte), "ridge" (FLOP/byte where the roofs meet), "floor_ms",
        "fraction" (realistic floor / ms), "hard_fraction", "tb_s", "tflop_s", "reason"}.
    """
    t_mem, t_comp = nbytes / peaks.real_bytes_per_s, flops / peaks.real_flops_per_s
    limit = "memory" if t_mem >= t_comp else "compute"
    floor_ms = max(t_mem, t_comp) * 1e3
    hard_floor = max(nbytes / peaks.bytes_per_s, flops / peaks.flops_per_s) * 1e3
    fraction = floor_ms / ms if ms and ms > 0 else 0.0
    out: dict[str, Any] = {
        "limit": limit,
        "intensity": flops / nbytes if nbytes else None,
        "ridge": peaks.real_flops_per_s / peaks.real_bytes_per_s,
        "floor_ms": floor_ms,
        "fraction": fraction,
        "hard_fraction": hard_floor / ms if ms and ms > 0 else 0.0,
        "tb_s": nbytes / (ms * 1e-3) / 1e12 if ms and ms > 0 else None,
        "tflop_s": flops / (ms * 1e-3) / 1e12 if ms and ms > 0 else None,
    }
    if ms < LAUNCH_MS or (wall_ms is not None and ms > 0 and wall_ms / ms >= LAUNCH_WALL_RATIO
                          and fraction < BOUND_FRACTION):
        out["bound"] = "launch"
        out["reason"] = (f"{ms * 1e3:.1f} us of GPU time per call" +
                         (f" against {wall_ms * 1e3:.1f} us of eager wall time" if wall_ms is not None else "") +
                         ": launch and ramp-up dominate")
    elif fraction >= BOUND_FRACTION:
        out["bound"] = limit
        unit = "TB/s" if limit == "memory" else "TFLOP/s"
        achieved = out["tb_s"] if limit == "memory" else out["tflop_s"]
        ceiling = (peaks.real_bytes_per_s if limit == "memory" else peaks.real_flops_per_s) / 1e12
        out["reason"] = f"{achieved:.3g} {unit} of a realistic {ceiling:g} {unit} ({100 * fraction:.0f}% of the roof)"
    else:
        out["bound"] = "latency"
        out["reason"] = (f"only {100 * fraction:.0f}% of the {limit} roof: neither memory nor compute is busy, "
                         "so the kernel waits (too little work in flight, dependencies, or too small a grid)")
    return out
