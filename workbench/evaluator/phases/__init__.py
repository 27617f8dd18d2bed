"""The phases of one evaluation inside the service, in order: load, check, time, graph, profile.

- load: the candidate process imports the candidate file (a failure is a compile error);
- check (correctness.py): every shape over its pool seeds, stopping at the first shape that fails;
- time (measurement.py): interleaved candidate and baseline blocks on fresh inputs until the speedup is known;
- graph (graphs.py): both sides as CUDA-graph replays, where the task or the caller asks for it;
- profile (profiling.py): kernel tables, provenance and the profiler's independent timer (CUDA).
run() drives them and sends the final message; each phase returns a worker failure (compile error, crash,
forbidden) that ends the evaluation, or None.
"""

from __future__ import annotations

import time
from typing import Any

from workbench.evaluator import limits
from workbench.evaluator.phases.context import Evaluation, Kept

__all__ = ["Evaluation", "run"]


def _load(ev: Evaluation) -> dict[str, Any] | None:
    """Wait for the candidate process to be ready (it may still be importing torch), then have it import the file."""
    ready_budget = limits.STARTUP_S if not ev.request.get("worker_ready") else limits.floor_s(ev.device)
    ev.channel.announce("startup", ready_budget, trusted=False)
    first = ev.channel.read()
    if not first.get("ready"):
        from workbench.evaluator.channel import WorkerLost

        raise WorkerLost("the candidate process did not start as expected")
    ev.worker_info = {k: first[k] for k in ("netns", "netns_note", "import_s") if k in first}
    reply = ev.ask({"op": "load"}, "load", limits.floor_s(ev.device))
    if not reply["ok"]:
        return reply
    ev.generate = bool(reply.get("generate"))
    return None


def _check(ev: Evaluation) -> dict[str, Any] | None:
    """Correctness of every shape in order; the first shape that fails ends the phase (the rest: not checked)."""
    from workbench.evaluator.phases import correctness

    order = [(g, name) for g in ev.service.groups(ev.request["heldout"]) for name in g["shapes"]]
    for i, (group, name) in enumerate(order):
        row = {"name": name, "group": group["group"], "role": group["role"]}
        ev.rows.append(row)
        ev.keys[name] = len(ev.keys)
        failure = correctness.check_shape(ev, row, name)
        if failure:
            return failure
        if row.get("forbidden") or row.get("correct") is False:
            ev.rows += [{"name": n, "group": g["group"], "role": g["role"], "correct": None,
                         "problem": f"not checked: shape {name} failed first"} for g, n in order[i + 1:]]
            return None
    return None


def _time(ev: Evaluation) -> dict[str, Any] | None:
    from workbench.evaluator import envinfo, timing
    from workbench.evaluator.phases import graphs, measurement, profiling

    service = ev.service
    sampler = None
    if ev.device == "cuda":
        ev.clocks_before = envinfo.quick_clocks()
        sampler = envinfo.ClockSampler()
        sampler.start()
    try:
        with timing.pinned(service.timing_cpu if ev.device == "cuda" else None):
            for order, row in enumerate(ev.rows):
                kept = Kept(service.shapes[row["name"]])
                ev.kept[ev.keys[row["name"]]] = kept
                failure = measurement.add_timing_sets(ev, row, kept, service.fresh_count)
                if failure:
                    return failure
                failure = measurement.time_shape(ev, row, order)
                if failure or row.get("correct") is False:
                    return failure
                if ev.device == "cuda" and ev.request["graph"]:
                    failure = graphs.time_graph(ev, row, order)
                    if failure:
                        return failure
            if ev.device == "cuda":
                return profiling.profile(ev, ev.rows)
    finally:
        if sampler is not None:
            ev.clocks_during = sampler.stop()
    return None


def run(ev: Evaluation) -> None:
    """Serve one evaluation request from its first step to the final message (worker loss propagates)."""
    started = time.monotonic()
    failure = _load(ev)
    if failure is None:
        ev.service.prepare_for(ev)
        failure = _check(ev)
        ok = all(r.get("correct") for r in ev.rows) and not any(r.get("forbidden") for r in ev.rows)
        if failure is None and ok:
            failure = _time(ev)
    ev.service.finish(ev, failure, time.monotonic() - started)
