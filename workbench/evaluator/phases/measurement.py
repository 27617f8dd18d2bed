"""The timing phase: interleaved blocks of candidate and baseline reps on fresh inputs until the speedup is known.

Both sides time on input sets drawn for this evaluation alone (fresh secret seeds, never pooled), so outputs a
candidate stored from earlier evaluations can never answer a timed call. Before every rep the inputs are
refilled with one of those sets and L2 is flushed, outside the window; one random rep per candidate block is
spot-checked against the oracle, and the output of an extra call on another set is re-validated in full after the
loop (HARNESS.md C9, C10, T3, T4). Blocks alternate between the sides until the speedup's 95% interval is within
the stated precision (stats.StopRule), with a floor of reps and blocks and a ceiling of reps and time.
"""

from __future__ import annotations

import math
import time
from typing import Any

from workbench.evaluator import limits
from workbench.evaluator.phases.context import Evaluation, Kept, TimingSet

SPOT_SAMPLE = 1 << 16
"""Values per output a spot check compares (inputs.subset_index)."""


def add_timing_sets(ev: Evaluation, row: dict[str, Any], kept: Kept, count: int) -> dict[str, Any] | None:
    """Draw the shape's fresh timing sets in both processes and compare their fingerprints."""
    service = ev.service
    shape = kept.shape
    key = ev.keys[shape.name]
    first = service.pool.size
    prepared = service.fresh_sets(shape, count)
    items = []
    for j, p in enumerate(prepared):
        inputs = service.inputs(shape, p.seed)
        kept.sets.append(TimingSet(first + j, inputs, p))
        item: dict[str, Any] = {"index": first + j, "seed": p.seed}
        if not ev.generate:
            item["inputs"] = ev.slab_out.pack(inputs)
        items.append(item)
    reply = ev.ask({"op": "add_sets", "key": key, "params": shape.params, "sets": items}, "inputs",
                   shape.limits.call_s, group=row["group"], shape=shape.name)
    if not reply["ok"]:
        return reply
    if ev.generate:
        for s in kept.sets:
            if reply["fingerprints"].get(str(s.index)) != s.prepared.fingerprint:
                return {"verdict": "forbidden", "message": "the timing inputs in the candidate process differ from "
                        "the service's (fingerprint mismatch): make_inputs was altered there"}
    return None


def spot_check(ev: Evaluation, kept: Kept, plan: list[int], spots: list[dict[str, Any]], seed: int) -> str | None:
    """Compare kept outputs of timed reps with the oracle's outputs for the input set each rep used."""
    import torch

    from workbench.evaluator import checks, inputs as inputs_mod

    names, tols = ev.service.outputs, ev.service.tols
    for spot in spots:
        rep = int(spot["rep"])
        expected = kept.by_index(plan[rep]).prepared.expected
        values = spot["outputs"]
        if len(values) != len(expected):
            return f"timed call {rep} returned {len(values)} value(s), expected {len(expected)}"
        for j, (got, ref) in enumerate(zip(values, expected)):
            if not isinstance(got, torch.Tensor):
                return f"timed call {rep}: output {names[j]} is not a torch.Tensor"
            flat = ref.reshape(-1)
            want = flat[inputs_mod.subset_index(flat.numel(), seed + j, SPOT_SAMPLE).to(flat.device)]
            if got.shape != want.shape:
                return f"timed call {rep}: output {names[j]} has {got.numel()} checked values, expected {want.numel()}"
            bad = int((~torch.isfinite(got)).sum()) if got.is_floating_point() else 0
            err = checks.rel_rms(want, got) if want.numel() else 0.0
            if bad or not err <= tols[j]:
                why = f"{bad} NaN/inf" if bad else f"rel_rms {err:.3g} > tol {tols[j]:.3g}"
                return (f"spot check of timed call {rep} failed on output {names[j]} ({why}): timed calls must "
                        "compute the result for their own inputs (no caching, deferral or drift)")
    return None


def time_shape(ev: Evaluation, row: dict[str, Any], order: int) -> dict[str, Any] | None:
    """Warm up both sides, then alternate blocks of baseline and candidate reps until the stopping rule says the
    speedup is known; spot-check and re-validate. Returns a worker failure, or None."""
    from workbench.evaluator import checks, inputs as inputs_mod, stats, timing

    service = ev.service
    key = ev.keys[row["name"]]
    kept = ev.kept[key]
    shape = kept.shape
    where = {"group": row["group"], "shape": row["name"]}
    indices = [s.index for s in kept.sets]
    base_buf = inputs_mod.clone(kept.sets[0].inputs)
    cuda = ev.device == "cuda"
    timer = service.timer
    baseline = service.baseline.fn
    rule = service.stop_rule
    if cuda:
        warm_n = ev.rng.randint(3, 8)  # random, so warm-up and measurement look alike (HARNESS.md T4)
        reply = ev.ask({"op": "warmup", "key": key, "n": warm_n}, "warmup",
                       limits.block_limit(warm_n, max(row.get("call_ms") or [0.0]), ev.device), **where)
        if not reply["ok"]:
            return reply
        ev.channel.announce("warmup", limits.block_limit(warm_n, shape.baseline_ms or 0.0, ev.device)
                            + limits.TRUSTED_S["timing"], trusted=True, side="baseline", **where)
        est = max(float(reply["ms"]), timer.warmup(baseline, base_buf, warm_n))
    else:
        est = 0.0  # the interpreter was warmed by the correctness calls and gets a fixed rep count
    per_block = timing.block_size(est, ev.device)
    cand_ms: list[float] = []
    cand_wall: list[float] = []
    base_ms: list[float] = []
    base_wall: list[float] = []
    checked = 0
    sides = ["candidate", "baseline"] if order % 2 == 0 else ["baseline", "candidate"]
    previous: int | None = None
    problem = None
    after = indices[0]
    blocks = 0
    block_s = limits.block_limit(per_block + 1, est, ev.device)
    started = time.monotonic()
    while True:
        plan = ev.plan(per_block, indices, previous)
        previous = plan[-1]
        after = ev.plan(1, indices, plan[-1])[0] if cuda else plan[-1]
        for side in sides:
            if side == "candidate":
                check = [ev.rng.randrange(per_block)]
                subset_seed = ev.rng.randrange(1 << 30)
                reply = ev.ask({"op": "time", "key": key, "plan": plan, "check": check, "subset_seed": subset_seed,
                                "after": after}, "timing", block_s, **where)
                if not reply["ok"]:
                    return reply
                cand_ms += [float(x) for x in reply["ms"]]
                cand_wall += [float(x) for x in reply["wall"]]
                problem = problem or spot_check(ev, kept, plan, ev.tensors(reply["spots"]), subset_seed)
                checked += len(check)
            else:
                ev.channel.announce("timing", block_s + limits.TRUSTED_S["timing"], trusted=True, side="baseline",
                                    **where)

                def refill(i: int, plan: list[int] = plan) -> None:
                    inputs_mod.refill(base_buf, kept.by_index(plan[i]).inputs)

                ms, _ = timer.block(baseline, base_buf, per_block, refill=refill)
                base_ms += ms
                if cuda:
                    wall, _ = timer.isolated(baseline, base_buf,
                                             refill=lambda i: inputs_mod.refill(base_buf, kept.by_index(after).inputs))
                    base_wall.append(wall)
                else:
                    base_wall += ms
        blocks += 1
        if problem or (blocks >= timing.CPU_BLOCKS if not cuda else
                       rule.done(base_ms, cand_ms, blocks, time.monotonic() - started)):
            break
    reply = ev.ask({"op": "output", "key": key}, "revalidate", shape.limits.call_s, **where)
    if not reply["ok"]:
        return reply
    outs = ev.tensors(reply["outputs"])
    ref = kept.by_index(int(reply.get("set", after))).prepared
    verdict = checks.compare(outs, reply["meta"], ref.expected, ref.dtypes, service.outputs, service.tols, ev.device)
    if reply.get("mutated"):
        problem = problem or f"forward modified its input(s) {', '.join(map(str, reply['mutated']))} during timing"
    elif not verdict["ok"]:
        problem = problem or f"after the timing loop: {verdict['problem']}"
    c, b = stats.summarize(cand_ms), stats.summarize(base_ms)
    ci = stats.ratio_ci(base_ms, cand_ms)
    row.update(
        ms=c["median"], ms_iqr=c["iqr"], ms_min=c["min"],
        baseline_ms=b["median"], baseline_ms_iqr=b["iqr"],
        wall_ms=stats.summarize(cand_wall)["median"], baseline_wall_ms=stats.summarize(base_wall)["median"],
        reps=len(cand_ms), blocks=blocks, revalidated=problem is None, spot_checks=checked,
    )
    if cuda and math.isfinite(ci.low):
        row["speedup_ci"] = [ci.low, ci.high]
        row["precision"] = ci.rel_halfwidth
    if problem:
        row.update(correct=False, problem=problem)
    return None
