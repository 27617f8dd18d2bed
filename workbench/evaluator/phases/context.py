"""One evaluation inside the service: the request, its rows, the input sets it keeps for timing, its warnings.

The phases (correctness, measurement, graphs, profiling) read and fill an Evaluation; the service (harness.py)
owns what outlives it: the reference and baseline, the oracle cache, the seed pools, the timer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from workbench.evaluator.channel import Channel, WorkerLost
from workbench.evaluator.oracle import OracleCache, Prepared
from workbench.evaluator.seeds import SeedPool
from workbench.evaluator.stats import StopRule
from workbench.evaluator.trusted import Baseline, ShapeState


class ServiceView(Protocol):
    """What the phases use of the service (workbench.evaluator.harness.Service)."""

    device: str
    channel: Channel
    torch: Any
    timer: Any
    baseline: Baseline | None
    shapes: dict[str, ShapeState]
    pool: SeedPool
    cache: OracleCache
    stop_rule: StopRule
    outputs: list[str]
    tols: list[float]
    fresh_count: int
    timing_cpu: int | None

    def groups(self, heldout: bool) -> list[dict[str, Any]]: ...
    def inputs(self, shape: ShapeState, seed: int) -> dict[str, Any]: ...
    def warm(self, shape: ShapeState) -> None: ...
    def expected(self, shape: ShapeState, seed: int, slot: int) -> Prepared: ...
    def fresh_sets(self, shape: ShapeState, n: int) -> list[Prepared]: ...
    def launch_overhead(self) -> float | None: ...
    def prepare_for(self, ev: "Evaluation") -> None: ...
    def finish(self, ev: "Evaluation", failure: dict[str, Any] | None, elapsed: float) -> None: ...


@dataclass
class TimingSet:
    """One fresh input set of a shape, as the timing phases use it: the worker's index for it, the inputs (here
    too, for the baseline's reps) and the oracle's outputs for the spot checks."""

    index: int
    inputs: dict[str, Any]
    prepared: Prepared


@dataclass
class Kept:
    """What the timing phases keep of one checked shape."""

    shape: ShapeState
    sets: list[TimingSet] = field(default_factory=list)

    def by_index(self, index: int) -> TimingSet:
        for s in self.sets:
            if s.index == index:
                return s
        raise KeyError(index)


class Evaluation:
    """The state of one evaluation request."""

    def __init__(self, service: ServiceView, request: dict[str, Any]) -> None:
        self.service = service
        self.request = request
        self.channel: Channel = service.channel
        self.device = service.device
        self.rng = random.Random()
        """Plans, spot-check picks and warm-up counts (not secret: seeds come from the seed pool)."""
        self.rows: list[dict[str, Any]] = []
        self.keys: dict[str, int] = {}
        """Shape name -> the key both processes file its input sets under."""
        self.kept: dict[int, Kept] = {}
        self.warnings: list[str] = []
        self.generate = True
        """True when the candidate process draws inputs itself from seeds (else they travel through the slab)."""
        self.worker_info: dict[str, Any] = {}
        """The candidate process's "ready" report (its isolation, its import time)."""
        self.compile_stats: list[dict[str, Any]] = []
        self.clocks_before: dict[str, Any] | None = None
        self.clocks_during: dict[str, Any] | None = None
        self.limits: dict[str, Any] = {}
        self.cache_before = service.cache.stats.as_dict()
        self.slab_out: Any = None
        self.slab_in: Any = None
        self.healthy = True
        """False when the service's own GPU context failed its check after the candidate process faulted."""

    # -- the candidate process -----------------------------------------------------------------------------------

    def ask(self, msg: dict[str, Any], stage: str, budget_s: float, **where: Any) -> dict[str, Any]:
        """A request to the candidate process under a candidate step (channel.ask)."""
        return self.channel.ask(msg, stage, budget_s, **where)

    def tensors(self, packed: Any) -> Any:
        """Tensors the candidate process put in its slab, copied onto this device.

        Raises:
            WorkerLost: a descriptor that does not fit the slab (the other side is misbehaving).
        """
        from workbench.evaluator import slab

        try:
            return self.slab_in.unpack(packed, self.device)
        except slab.SlabError as exc:
            raise WorkerLost(f"the candidate process sent a bad tensor descriptor ({exc})") from None

    def display(self) -> str:
        return str(self.request["display"])

    def plan(self, n: int, indices: list[int], previous: int | None) -> list[int]:
        """Set indices for n reps: random, never the same set twice in a row (a result cache then always misses)."""
        out: list[int] = []
        last = previous
        for _ in range(n):
            choices = [i for i in indices if i != last] or indices[:1]
            last = self.rng.choice(choices)
            out.append(last)
        return out
