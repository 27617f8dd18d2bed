"""Assemble an evaluation's "profile": per-shape kernel tables, roofline class, compile stats and advice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.devices import peaks_for
from workbench.profiler import kernels as kernels_mod
from workbench.profiler.roofline import classify
from workbench.profiler.rules import advise

if TYPE_CHECKING:
    from workbench.tasks import Task


def build(task: "Task", rows: list[dict[str, Any]], compile_stats: list[dict[str, Any]],
          sms: int | None = None, gpu: str | None = None) -> dict[str, Any]:
    """The result's "profile" section from the harness's timed rows (CUDA only).

    Args:
        task: the task (its FLOP and byte formulas classify each shape).
        rows: harness rows with ms, wall_ms and, when profiled, a "profile" entry (kernel table, kernel_ms).
        compile_stats: Triton compile stats of the candidate's kernels.
        sms: the GPU's SM count, for the grid rule.
        gpu: the GPU's name, for its roofline ceilings (workbench.devices.peaks_for).

    Returns:
        {"source", "shapes": [{"name", "ms", "wall_ms", "kernel_ms", "event_vs_kernel", "calls", "kernels",
        "baseline_kernels", "roofline"}], "compile", "findings"}.
    """
    peaks = peaks_for(gpu)
    shapes = []
    for row in rows:
        ms = row.get("ms")
        if not isinstance(ms, (int, float)) or not ms > 0:
            continue
        flops, nbytes = task.work(row["name"])
        prof = row.get("profile") or {}
        shapes.append({
            "name": row["name"],
            "role": row.get("role", "public"),
            "ms": ms,
            "wall_ms": row.get("wall_ms"),
            "kernel_ms": prof.get("kernel_ms"),
            "event_vs_kernel": prof.get("event_vs_kernel"),
            "event_overhead_us": prof.get("event_overhead_us"),
            "launch_overhead_us": prof.get("launch_overhead_us"),
            "event_net_vs_kernel": prof.get("event_net_vs_kernel"),
            "calls": prof.get("calls"),
            "kernels": prof.get("kernels", []),
            "baseline_kernels": prof.get("baseline_kernels", []),
            "roofline": classify(flops, nbytes, ms, peaks=peaks, wall_ms=row.get("wall_ms")),
        })
    profile: dict[str, Any] = {
        "source": "torch.profiler (CUPTI) over a few calls per shape, inputs refilled and L2 flushed before each; "
                  f"roofline from the task's FLOP/byte formulas against {peaks.describe()}",
        "shapes": shapes,
        "compile": compile_stats,
    }
    profile["findings"] = advise(profile, sms)
    return profile


def format_profile(profile: dict[str, Any]) -> list[str]:
    """Text lines: per shape the roofline class and the kernel table, then compile stats and findings."""
    lines = []
    for shape in profile.get("shapes") or []:
        roof = shape["roofline"]
        agree = shape.get("event_vs_kernel")
        extra = f", events/kernel sum {agree:.3f}" if agree else ""
        if agree and shape.get("event_net_vs_kernel") is not None:
            extra += (f" ({shape['event_net_vs_kernel']:.3f} less {shape['launch_overhead_us']:.1f} us of "
                      f"window overhead)")
        lines.append(f"{shape['name']}: {shape['ms']:.4g} ms, {roof['bound']}-bound ({roof['reason']}){extra}")
        lines += kernels_mod.format_table(shape.get("kernels") or [], indent="    ")
        if shape.get("baseline_kernels"):
            names = ", ".join(k["name"][:50] for k in shape["baseline_kernels"][:3])
            lines.append(f"    baseline kernels: {names}")
    for stat in profile.get("compile") or []:
        lines.append(f"compiled {stat['kernel']}: {stat.get('regs')} regs/thread, {stat.get('spills')} spills, "
                     f"{stat.get('shared')} B smem, {stat.get('num_warps')} warps, {stat.get('num_stages')} stages")
    for finding in profile.get("findings") or []:
        lines.append(f"[{finding['severity']}] {finding['message']}")
    return lines
