"""The CUDA-graph phase (task option graph_timing, or --graph): both sides timed as graph replays, interleaved.

Each side's forward is captured once on its timing buffers and replayed with fresh inputs and a flush before every
rep. The candidate's last replay is spot-checked; a side that cannot be captured, or whose replay is wrong, gets no
graph figure and a warning (the event timing stands on its own).
"""

from __future__ import annotations

import math
from typing import Any

from workbench.evaluator import limits
from workbench.evaluator.phases.context import Evaluation
from workbench.evaluator.phases.measurement import spot_check

MIN_REPS, MAX_REPS = 20, 100
"""Replays per side per shape: half the event reps, within these bounds (replays vary far less than eager calls)."""
TARGET_MS = 150.0
"""... and no more replays than about this much GPU time per side (a slow kernel needs few)."""
MAX_BLOCKS = 5
"""Interleaved blocks per side at most."""


def time_graph(ev: Evaluation, row: dict[str, Any], order: int) -> dict[str, Any] | None:
    """Graph replays of both sides on one shape; returns a worker failure, or None."""
    from workbench.evaluator import inputs as inputs_mod, stats

    service = ev.service
    key = ev.keys[row["name"]]
    kept = ev.kept[key]
    where = {"group": row["group"], "shape": row["name"]}
    indices = [s.index for s in kept.sets]
    timer = service.timer
    est = max(float(row.get("ms") or 0.0), float(row.get("baseline_ms") or 0.0))
    reps = min(MAX_REPS, max(MIN_REPS, int(row.get("reps") or 0) // 2), max(5, math.ceil(TARGET_MS / max(est, 1e-3))))
    blocks = max(1, min(MAX_BLOCKS, int(row.get("blocks") or 1), reps))
    per_block = max(1, math.ceil(reps / blocks))
    block_s = limits.block_limit(per_block, est, ev.device)
    sides = ["candidate", "baseline"] if order % 2 == 0 else ["baseline", "candidate"]
    base_buf = inputs_mod.clone(kept.sets[0].inputs)
    ev.channel.announce("graph", limits.TRUSTED_S["timing"], trusted=True, side="baseline", **where)
    try:
        timer.warmup(service.baseline.fn, base_buf, 1)
        base_graph, _ = timer.capture(service.baseline.fn, base_buf)
    except Exception as exc:  # noqa: BLE001 - reported, the event timing stands
        service.torch.cuda.synchronize()
        base_graph = None
        row["baseline_graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
    cand: list[float] = []
    base: list[float] = []
    previous: int | None = None
    for _ in range(blocks):
        plan = ev.plan(per_block, indices, previous)
        previous = plan[-1]
        for side in sides:
            if side == "candidate" and "graph_error" not in row:
                seed = ev.rng.randrange(1 << 30)
                # The first request also captures the graph (one more call, which may compile nothing new).
                budget = block_s + (row_call_s(ev, row) if not cand else 0.0)
                reply = ev.ask({"op": "graph", "key": key, "plan": plan, "subset_seed": seed}, "graph", budget,
                               **where)
                if not reply["ok"]:
                    return reply
                if "graph_error" in reply:
                    row["graph_error"] = reply["graph_error"]
                    continue
                wrong = spot_check(ev, kept, plan, ev.tensors(reply["spots"]), seed)
                if wrong:
                    row["graph_error"] = f"graph replay: {wrong}"
                    continue
                cand += [float(x) for x in reply["ms"]]
            elif side == "baseline" and base_graph is not None:
                ev.channel.announce("graph", block_s + limits.TRUSTED_S["timing"], trusted=True, side="baseline",
                                    **where)

                def refill(i: int, plan: list[int] = plan) -> None:
                    inputs_mod.refill(base_buf, kept.by_index(plan[i]).inputs)

                base += timer.graph_block(base_graph, per_block, refill=refill)
    for name, error, ms in (("graph_ms", "graph_error", cand), ("baseline_graph_ms", "baseline_graph_error", base)):
        if ms and not row.get(error):
            summary = stats.summarize(ms)
            row[name], row[name + "_iqr"] = summary["median"], summary["iqr"]
    for name in ("graph_error", "baseline_graph_error"):
        if row.get(name):
            side = "candidate" if name == "graph_error" else "baseline"
            ev.warnings.append(f"{row['name']}: no CUDA-graph time for the {side}: {row[name]}")
    return None


def row_call_s(ev: Evaluation, row: dict[str, Any]) -> float:
    """The shape's call limit (a capture is one call)."""
    return ev.service.shapes[row["name"]].limits.call_s
