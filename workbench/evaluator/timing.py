"""Timing of one callable: warm-up, L2 flush before every rep, CUDA events plus host wall time after a device sync."""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any, Callable

import torch

FLUSH_BYTES = 512 * 1024 * 1024
"""Zeroed before every CUDA rep, outside the timed window: far more than the H200's ~50 MB L2. It is twice
do_bench's 256 MB because the flush also hides the host launch path behind it (block()): on the H200 box a
256 MB flush took 0.07 ms, and a Triton launch from Python came close to that, leaking into some reps."""

TARGET_MS = 300.0
"""Aim for at least this much measured kernel time per side per shape ..."""
MIN_REPS, MAX_REPS = 100, 2000
"""... and at least MIN_REPS reps, at most MAX_REPS."""
MAX_SIDE_MS = 20_000.0
"""A very slow candidate gets fewer reps rather than a minute-long measurement (it has lost anyway)."""
CPU_REPS = 2
"""Interpreter timings are not comparable; a couple of reps only record them."""


def plan_reps(est_ms: float, device: str) -> int:
    """How many reps each side gets for one shape, from the slower side's warm-up estimate."""
    if device != "cuda":
        return CPU_REPS
    est = max(est_ms, 1e-3)
    reps = min(MAX_REPS, max(MIN_REPS, math.ceil(TARGET_MS / est)))
    if reps * est > MAX_SIDE_MS:
        reps = max(10, math.ceil(MAX_SIDE_MS / est))
    return reps


def pin_cpu(slot: int) -> int | None:
    """Pin this process to one allowed CPU (slot-th, wrapping), so host launch overhead does not migrate."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
        cpu = allowed[slot % len(allowed)]
        os.sched_setaffinity(0, {cpu})
        return cpu
    except (AttributeError, OSError):
        return None


def summarize(ms: list[float]) -> dict[str, float]:
    """Median, IQR and extremes of per-rep times."""
    if not ms:
        return {"median": math.nan, "iqr": math.nan, "min": math.nan, "max": math.nan}
    if len(ms) >= 4:
        q1, _, q3 = statistics.quantiles(ms, n=4)
    else:
        q1 = q3 = statistics.median(ms)
    return {"median": statistics.median(ms), "iqr": q3 - q1, "min": min(ms), "max": max(ms)}


class Timer:
    """Times calls of fn(**kwargs) on one device; the same code times the baseline and the candidate."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self._flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if self.cuda else None
        self.flush_ms = self._time_flush() if self.cuda else 0.0
        """GPU time of one flush: how much host launch latency the flush hides, and the known part of wall_ms."""

    def _time_flush(self) -> float:
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._flush.zero_()  # type: ignore[union-attr]
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    def sync(self) -> None:
        """Device-wide: waits for every stream, so work launched on a side stream is not missed."""
        if self.cuda:
            torch.cuda.synchronize()

    def call(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        """One untimed call, synchronised (compilation and autotuning happen here)."""
        out = fn(**kwargs)
        self.sync()
        return out

    def warmup(self, fn: Callable[..., Any], kwargs: dict[str, Any], n: int) -> float:
        """n untimed-for-the-result calls; returns the median host time per call in ms, to plan reps."""
        times = []
        for _ in range(max(1, n)):
            t0 = time.perf_counter()
            self.call(fn, kwargs)
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def block(self, fn: Callable[..., Any], kwargs: dict[str, Any], n: int) -> tuple[list[float], list[float], Any]:
        """n timed reps.

        On CUDA each rep enqueues the L2 flush, then the start event, the call and the end event, and ends with a
        device-wide synchronize. No host sync sits between the flush and the call: the GPU is still flushing
        while the host runs the launch path, so the events measure the kernels and not Python launch latency
        (which would penalise Triton's heavier launch against a torch op). The host wall time runs from just
        before the call to just after the device-wide sync, so work that escapes the events (a side stream)
        still shows there; it also holds whatever part of the flush the launch did not overlap.

        Returns:
            (per-rep ms by CUDA events, or host time on CPU; per-rep host wall ms; the last output, so the caller
            can re-validate what the timed calls produced).
        """
        ms: list[float] = []
        wall: list[float] = []
        out = None
        if not self.cuda:
            for _ in range(n):
                t0 = time.perf_counter()
                out = fn(**kwargs)
                wall.append((time.perf_counter() - t0) * 1e3)
            return list(wall), wall, out
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            self._flush.zero_()  # type: ignore[union-attr]
            starts[i].record()
            t0 = time.perf_counter()
            out = fn(**kwargs)
            ends[i].record()
            torch.cuda.synchronize()
            wall.append((time.perf_counter() - t0) * 1e3)
        ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        return ms, wall, out
