"""Time limits derived from the task's own timing, so a hang is found in seconds, not minutes.

A call of the candidate may take a generous multiple of the baseline's time on the same shape, never less than a
floor; a block of timed reps a multiple of its expected time; the whole evaluation the sum of its parts. A Triton
compile is the one thing that legitimately takes tens of seconds: the worker reports when one starts and ends
(Triton's JIT hooks), and a compile in progress gets its own limit instead of every call getting a compile-sized
one. The trusted side (oracle, baseline warm-up and autotuning) has limits of its own: running past one is a fault
of the evaluation service, not a timeout of the candidate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

FLOOR_S = {"cuda": 5.0, "cpu": 10.0}
"""No candidate step gets less (the interpreter's slowest shipped call is under 1.1 s)."""
CALL_FACTOR = 50.0
"""A call may take this many times the baseline's call on the same shape (CUDA; the interpreter has no peer)."""
BLOCK_FACTOR = 10.0
"""A block of timed reps may take this many times what its warm-up predicted."""
COMPILE_S = 120.0
"""A Triton compile the worker reported as started (one kernel specialisation, or one autotuning config)."""
STARTUP_S = 180.0
"""A candidate process still importing torch when its evaluation begins (a cold machine)."""
PROFILE_S = 60.0
"""The profiler pass: starting the profiler plus a few calls per shape."""
TRUSTED_S = {"baseline": 900.0, "oracle": 300.0, "inputs": 120.0, "service": 180.0, "timing": 120.0}
"""The trusted side's own steps: warming up and autotuning the baseline on a shape (a fresh machine compiles every
autotuning config), computing an oracle output, drawing inputs, starting the service, timing the baseline."""
ABORT_S = 15.0
"""After the candidate was stopped, how long the service gets to report that it has let go of it."""


def floor_s(device: str) -> float:
    """The shortest limit any candidate step gets on a device."""
    return FLOOR_S["cuda" if device == "cuda" else "cpu"]


def call_limit(baseline_ms: float | None, device: str) -> float:
    """Seconds one checked call of the candidate may take on a shape whose baseline call takes baseline_ms."""
    floor = floor_s(device)
    if device != "cuda" or not baseline_ms or baseline_ms <= 0:
        return floor
    return max(floor, CALL_FACTOR * baseline_ms / 1e3)


def block_limit(reps: int, est_ms: float, device: str) -> float:
    """Seconds a request running `reps` calls of about est_ms each may take (timing blocks, warm-up, graphs)."""
    return floor_s(device) + BLOCK_FACTOR * max(0, reps) * max(0.0, est_ms) / 1e3


@dataclass(frozen=True)
class ShapeLimits:
    """The limits of one shape's candidate steps."""

    call_s: float
    """One checked call (correctness, re-validation)."""
    calls: int
    """Checked calls the evaluation makes on this shape."""
    timing_s: float
    """Everything timed on this shape: warm-up, interleaved blocks, graphs (candidate side)."""


def shape_limits(baseline_ms: float | None, device: str, calls: int, max_side_ms: float) -> ShapeLimits:
    """The limits of one shape, from the baseline's call time and the most measured time a side may get."""
    call = call_limit(baseline_ms, device)
    # Timing reps are the candidate's own (it may be slower than the baseline): the budget is what the stopping rule
    # allows a side, twice for the graphs, plus a call limit per request of fixed cost.
    timing = 2 * max_side_ms / 1e3 + 4 * call
    return ShapeLimits(call, calls, timing)


def evaluation_limit(shapes: list[ShapeLimits], device: str, compiles: int = 4) -> float:
    """The whole evaluation's limit: the sum of its parts, plus room for a few compiles and the profiler."""
    total = floor_s(device) + PROFILE_S + compiles * COMPILE_S
    for shape in shapes:
        total += shape.calls * shape.call_s + shape.timing_s
    return total


def as_dict(shapes: dict[str, ShapeLimits], evaluation_s: float) -> dict[str, object]:
    """The limits as the result reports them."""
    return {"evaluation_s": round(evaluation_s, 1), "compile_s": COMPILE_S,
            "shapes": {name: {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(s).items()}
                       for name, s in shapes.items()}}
