"""Timing of one callable: fresh inputs and an L2 flush before every rep, CUDA events, isolated wall-clock reps.

The same Timer times the baseline (in the harness) and the candidate (in the worker), so both sides get identical
treatment: the same input rotation, flush and event placement.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from typing import Any, Callable, Iterator

import torch

FLUSH_BYTES = 256 * 1024 * 1024
"""Zeroed before every CUDA rep, after the input refill and outside the timed window: five times the H200's
50 MB L2, the size triton.testing.do_bench uses."""

BLOCK_TARGET_MS = 12.0
"""Measured kernel time per side per interleaved block: short blocks interleave often, long ones waste less on
round trips. How many blocks a shape gets is the stopping rule's business (stats.StopRule)."""
MIN_BLOCK, MAX_BLOCK = 4, 64
"""Reps per block, at least and at most."""
HOST_AHEAD_MS = 0.3
"""Host time budgeted per rep when a block is gated: the GPU first sleeps this long per rep, so the host has
enqueued every rep (refill, flush, events, the call) before the first window opens. Without the gate a host
stall (an nvidia-smi query holding the driver lock, a busy CPU) drains the queue and a short kernel's window
then includes waiting for its own launch: seen on the H200 as S2 medians of 23-32 us against 21 us."""
GATE_MAX_MS = 40.0
"""The gate's upper bound; longer blocks are rare (blocks are sized to about BLOCK_TARGET_MS of kernels)."""
CPU_BLOCKS = 2
"""Interpreter timings are not comparable: two blocks of one rep only record them."""

Refill = Callable[[int], None]
Keep = Callable[[int, Any], None]


def block_size(est_ms: float, device: str) -> int:
    """Reps per interleaved block for one shape, from the slower side's warm-up estimate."""
    if device != "cuda":
        return 1
    return min(MAX_BLOCK, max(MIN_BLOCK, math.ceil(BLOCK_TARGET_MS / max(est_ms, 1e-3))))


def pin_cpu(cpu: int | None) -> int | None:
    """Pin this process to one CPU (so host launch overhead does not migrate); returns it, or None when the
    machine does not let this process run there (or pinning is not supported here).

    The CPU need not be in the current mask (a waiting candidate process is kept off the timing CPUs until its
    evaluation), only in what the machine allows.
    """
    if cpu is None:
        return None
    try:
        os.sched_setaffinity(0, {cpu})
        return cpu
    except (AttributeError, OSError, OverflowError):
        return None


@contextlib.contextmanager
def pinned(cpu: int | None) -> Iterator[int | None]:
    """Pin this process to one CPU for the duration of a block, then give it back every CPU it had."""
    try:
        before = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        yield None
        return
    try:
        yield pin_cpu(cpu)
    finally:
        try:
            os.sched_setaffinity(0, before)
        except OSError:
            pass


class Timer:
    """Times calls of fn(**kwargs) on one device; the same code times the baseline and the candidate."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self._flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if self.cuda else None
        self._cycles_per_ms = self._sleep_rate() if self.cuda else 0.0
        self.flush_ms = self._time_flush() if self.cuda else 0.0
        """GPU time of one flush, reported with the timing method."""
        self.floors = self._time_floors() if self.cuda else {}
        """Event windows with no work and with the smallest kernel, measured like a rep: what any per-call
        figure includes beyond the kernels' own durations (the profiler's kernel sum excludes it)."""

    def _time_flush(self) -> float:
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.flush()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    @staticmethod
    def _sleep_rate() -> float:
        """GPU sleep cycles per ms of torch.cuda._sleep, measured (clock rates differ and boost)."""
        cycles = 2_000_000
        torch.cuda._sleep(cycles)  # first call loads the kernel
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        return cycles / max(start.elapsed_time(end), 1e-3)

    def gate(self, n: int) -> None:
        """Hold the stream (a GPU sleep) while the host enqueues n reps behind it."""
        ms = min(GATE_MAX_MS, n * HOST_AHEAD_MS)
        torch.cuda._sleep(int(ms * self._cycles_per_ms))

    def _time_floors(self, n: int = 30) -> dict[str, float]:
        tiny = torch.zeros(1, dtype=torch.int32, device="cuda")
        return {"empty_window_ms": statistics.median(self._flushed_windows(lambda i: None, n, None)),
                "tiny_kernel_window_ms": statistics.median(self._flushed_windows(lambda i: tiny.zero_(), n, None))}

    def flush(self) -> None:
        """Evict L2 by writing a buffer several times its size (enqueued; no host sync)."""
        if self._flush is not None:
            self._flush.zero_()

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
        """n untimed calls; returns the median host time per synchronised call in ms, to plan reps."""
        times = []
        for _ in range(max(1, n)):
            t0 = time.perf_counter()
            self.call(fn, kwargs)
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def block(self, fn: Callable[..., Any], kwargs: dict[str, Any], n: int, refill: Refill | None = None,
              keep: Keep | None = None) -> tuple[list[float], Any]:
        """n timed reps, enqueued back to back with one device-wide synchronise at the end.

        Each CUDA rep enqueues: refill(i) (new input values into the same buffers), the L2 flush, the start event,
        the call, the end event, then keep(i, out) for reps the caller wants to check. The whole block waits behind
        a GPU sleep long enough for the host to enqueue it (gate), so when a start event executes its kernel is
        already queued behind it: the events measure GPU time, without the host's launch latency and without a
        sync per rep (a sync per rep let launch latency leak into the window and spread the reps). Work that escapes the current stream is caught elsewhere: the profiler cross-check and
        the spot checks of kept outputs.

        Returns:
            (per-rep ms, from CUDA events, or host time per call on CPU; the last output).
        """
        out = None
        if not self.cuda:
            wall = []
            for i in range(n):
                if refill is not None:
                    refill(i)
                t0 = time.perf_counter()
                out = fn(**kwargs)
                wall.append((time.perf_counter() - t0) * 1e3)
                if keep is not None:
                    keep(i, out)
            return wall, out
        outs: list[Any] = [None]

        def call(i: int) -> None:
            outs[0] = fn(**kwargs)
            if keep is not None:
                keep(i, outs[0])

        return self._flushed_windows(call, n, refill), outs[0]

    def _flushed_windows(self, work: Callable[[int], None], n: int, refill: Refill | None) -> list[float]:
        """n event windows around work(i), each after refill(i) and the flush, behind a gate; one sync at the end."""
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        self.sync()
        self.gate(n)
        for i in range(n):
            if refill is not None:
                refill(i)
            self.flush()
            starts[i].record()
            work(i)
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    def capture(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        """One call of fn recorded as a CUDA graph on the buffers in kwargs (already warmed up eagerly).

        Returns:
            (the graph, its static output: after each replay it holds the result for the buffers' current values).

        Raises:
            whatever capture raises: a call that syncs with the host, or launches on a stream outside the capture,
            cannot be recorded; the caller reports that and keeps the event timing.
        """
        self.sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(**kwargs)
        self.sync()
        return graph, out

    def graph_block(self, graph: Any, n: int, refill: Refill | None = None) -> list[float]:
        """n timed replays of a captured call, each after refill(i) and the L2 flush, events around the replay.

        This removes what the host adds per launch (Python, argument packing, one launch per kernel), which eager
        event timing hides only while the host keeps ahead of the GPU: the figure a serving stack that replays
        graphs would see, for launch-bound candidates and baselines alike.
        """
        return self._flushed_windows(lambda i: graph.replay(), n, refill)

    def isolated(self, fn: Callable[..., Any], kwargs: dict[str, Any],
                 refill: Refill | None = None) -> tuple[float, Any]:
        """One eager call timed by the host clock from launch to after a device-wide sync, flushed first.

        This is what a caller waiting on the result sees (launch latency included), and it brackets side-stream
        work too, since the sync is device-wide.

        Returns:
            (host ms, the call's output).
        """
        if refill is not None:
            refill(0)
        self.flush()
        self.sync()
        t0 = time.perf_counter()
        out = fn(**kwargs)
        self.sync()
        return (time.perf_counter() - t0) * 1e3, out
