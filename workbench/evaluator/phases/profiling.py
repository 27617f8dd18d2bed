"""The profiler phase (CUDA): a few calls per shape under torch.profiler, candidate and baseline.

Gives the kernel table, the provenance check (only the candidate's Triton kernels, on the caller's stream) and an
independent timer (the kernel sum per call) to hold against the CUDA-event median. The baseline's kernel table of
a shape does not change while the service lives, so it is recorded once.
"""

from __future__ import annotations

import statistics
from typing import Any

from workbench.evaluator import limits
from workbench.evaluator.phases.context import Evaluation

CALLS = 5
"""Calls per shape recorded with torch.profiler (CUDA): the kernel table and the independent timer."""
BASELINE_CALLS = 2
"""Baseline calls per shape recorded, for its kernel names (HARNESS.md: record what the baseline ran)."""
AGREEMENT_WARN = 0.10
AGREEMENT_WARN_US = 5.0
"""Warn when the event median, less the measured window overhead, and the profiler's kernel sum differ by more than
10% and more than 5 us. Events include about 3 us per call that kernel durations do not (H200, constant across
shapes: launch and completion around the kernel), which alone is over 10% of an 18 us kernel."""
TINY_CALLS = 8
"""One-element kernels profiled to measure a timed window's fixed overhead."""
ESCAPE_RATIO = 0.5
"""An event median under this fraction of the profiler's kernel sum means work ran outside the timed window."""


def profile(ev: Evaluation, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Profile every row's shape, candidate then baseline; returns a worker failure, or None."""
    from workbench.evaluator import inputs as inputs_mod
    from workbench.profiler import capture, kernels

    service = ev.service
    ev.channel.announce("profile", limits.PROFILE_S, trusted=True, side="baseline")
    overhead = service.launch_overhead()
    plans = {row["name"]: ev.plan(CALLS, [s.index for s in ev.kept[ev.keys[row["name"]]].sets], None)
             for row in rows}
    calls = [(ev.keys[row["name"]], i) for row in rows for i in plans[row["name"]]]
    reply = ev.ask({"op": "profile", "calls": calls}, "profile", limits.PROFILE_S, group=rows[0]["group"],
                   shape=rows[0]["name"])
    if not reply["ok"]:
        return reply
    windows = kernels.attribute(reply["events"])
    ev.compile_stats = list(reply.get("compile", []))
    ev.channel.announce("profile", limits.PROFILE_S, trusted=True, side="baseline")
    todo = [row for row in rows if service.shapes[row["name"]].baseline_kernels is None]
    jobs = []
    for row in todo:
        kept = ev.kept[ev.keys[row["name"]]]
        buf = inputs_mod.clone(kept.sets[0].inputs)
        for i in plans[row["name"]][:BASELINE_CALLS]:
            def prepare(buf: dict[str, Any] = buf, src: dict[str, Any] = kept.by_index(i).inputs) -> None:
                inputs_mod.refill(buf, src)
                service.timer.flush()

            jobs.append((service.baseline.fn, buf, prepare))
    if jobs:
        base_windows = kernels.attribute(capture.capture(jobs))
        for n, row in enumerate(todo):
            theirs = base_windows[n * BASELINE_CALLS:(n + 1) * BASELINE_CALLS]
            service.shapes[row["name"]].baseline_kernels = kernels.kernel_table(theirs)
    for n, row in enumerate(rows):
        judge(ev, row, windows[n * CALLS:(n + 1) * CALLS], overhead)
        row["profile"]["baseline_kernels"] = service.shapes[row["name"]].baseline_kernels or []
    return None


def launch_overhead(timer: Any) -> float | None:
    """The flushed event window of a one-element kernel minus that kernel's own (profiled) duration, in ms.

    This is the fixed cost of a timed window (front-end launch, completion, event records; about 3 us on the
    H200), which kernel durations exclude: it separates an honest gap between the two timers from work that
    escaped one of them.
    """
    import torch

    from workbench.profiler import capture, kernels

    floor = timer.floors.get("tiny_kernel_window_ms")
    if floor is None:
        return None
    tiny = torch.zeros(1, dtype=torch.int32, device="cuda")
    jobs = [(lambda t=tiny: t.zero_(), {}, timer.flush) for _ in range(TINY_CALLS)]
    sums = [ms for ms in kernels.per_call_ms(kernels.attribute(capture.capture(jobs))) if ms > 0]
    return max(0.0, floor - statistics.median(sums)) if sums else None


def judge(ev: Evaluation, row: dict[str, Any], calls: list[list[dict[str, Any]]], overhead: float | None) -> None:
    """The row's profile entry, its provenance verdict and the two timers' agreement."""
    from workbench.profiler import kernels

    display = ev.display()
    sums = kernels.per_call_ms(calls)
    kernel_ms = sorted(sums)[len(sums) // 2] if sums else None
    row["profile"] = {"calls": len(calls), "kernel_ms": kernel_ms, "kernels": kernels.kernel_table(calls)}
    problems = kernels.provenance(calls, ev.request["jit_names"])
    if problems and "forbidden" not in row:
        row["forbidden"] = f"{display}: {problems[0]}"
    ms = row.get("ms")
    if not (kernel_ms and ms):
        return
    ratio = ms / kernel_ms
    row["profile"]["event_vs_kernel"] = ratio
    row["profile"]["event_overhead_us"] = (ms - kernel_ms) * 1e3
    if overhead is not None:
        # What every event window holds beyond kernel durations, measured apart: with it taken off, the two
        # timers should agree whatever the kernel's length.
        row["profile"]["launch_overhead_us"] = overhead * 1e3
        row["profile"]["event_net_vs_kernel"] = (ms - overhead) / kernel_ms
    if ratio < ESCAPE_RATIO and "forbidden" not in row:
        row["forbidden"] = (f"{display}: the timed window saw {ms:.4g} ms but the profiler saw {kernel_ms:.4g} ms of "
                            "GPU work per call: work escaped the timed window")
    else:
        net = ms - (overhead or 0.0)
        if abs(net / kernel_ms - 1) > AGREEMENT_WARN and abs(net - kernel_ms) * 1e3 > AGREEMENT_WARN_US:
            ev.warnings.append(f"{row['name']}: CUDA-event median {ms:.4g} ms (less {1e3 * (overhead or 0):.1f} us "
                               f"of window overhead) and profiler kernel sum {kernel_ms:.4g} ms differ by "
                               f"{100 * abs(net / kernel_ms - 1):.0f}%")
