"""What the evaluation service keeps across evaluations, as plain data: its baseline and each shape's state.

Kept apart from the service's process code (harness.py) so the phases can name these types without importing it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from workbench.evaluator import limits
from workbench.evaluator.oracle import Prepared


@dataclass
class Baseline:
    """What speedups are measured against on this service."""

    name: str
    fn: Callable[..., Any]
    note: str | None = None
    """Why it is not the task's baseline.py (unavailable here), if so."""
    autotuned: bool = False
    """Whether it brought Triton autotuners with it (a library such as FLA): worth precompiling on a new machine."""


@dataclass
class ShapeState:
    """What the service knows about one shape across evaluations."""

    name: str
    group: str
    role: str
    params: dict[str, Any]
    baseline_ms: float | None = None
    """The baseline's call time here once warm (host time of a synchronised call), for the time limits."""
    warm: bool = False
    error: str | None = None
    """Why preparing the shape failed in idle time (an evaluation retries once)."""
    limits: limits.ShapeLimits = field(default_factory=lambda: limits.ShapeLimits(0.0, 0, 0.0))
    """Its time limits (Service._limits: the floor until the baseline is warm, then from its call time)."""
    fresh: deque[Prepared] = field(default_factory=deque)
    """Timing sets prepared ahead (fresh seeds, oracle outputs), each for exactly one evaluation."""
    baseline_kernels: list[dict[str, Any]] | None = None
    """The baseline's kernel table on this shape (profiled once)."""
