"""The correctness phase: every correctness seed of a shape, candidate outputs against the oracle's.

The seeds come from the shape's secret pool and their oracle outputs from the service's cache, so this phase runs
the candidate and compares; the oracle ran once, in an earlier evaluation or in idle time. The reference's outputs
never exist in the candidate's process, so the order of reference and candidate does not matter (HARNESS.md C1);
outputs and fresh allocations are still poisoned before each call there.
"""

from __future__ import annotations

import math
from typing import Any

from workbench.evaluator.phases.context import Evaluation


def specs(prepared: Any) -> list[dict[str, Any]]:
    """Shapes and dtypes of the expected outputs: what the candidate process poisons before a call."""
    return [{"shape": list(t.shape), "dtype": str(d).removeprefix("torch.")}
            for t, d in zip(prepared.expected, prepared.dtypes)]


def check_shape(ev: Evaluation, row: dict[str, Any], name: str) -> dict[str, Any] | None:
    """Correctness of one shape over every pool seed; returns a worker failure that ends the evaluation.

    A wrong output marks the row incorrect (the caller stops at the first such shape); a forbidden op marks it
    forbidden. Seeds are named by their slot ("seed 1"), never by their secret value.
    """
    from workbench.evaluator import checks

    service = ev.service
    shape = service.shapes[name]
    service.warm(shape)  # once per shape per service: the shape's limits come from the baseline's time
    key = ev.keys[name]
    names, tols = service.outputs, service.tols
    row.update(correct=None, rel_err=None, baseline_rel_err=None, seeds_checked=0, problem=None)
    cand_by: dict[str, float] = {}
    base_by: dict[str, float] = {}
    where = {"group": row["group"], "shape": name}
    for slot, seed in enumerate(service.pool.seeds(name)):
        prepared = service.expected(shape, seed, slot)
        msg: dict[str, Any] = {"op": "run", "key": key, "index": slot, "params": shape.params, "seed": seed,
                               "specs": specs(prepared)}
        if not ev.generate:
            msg["inputs"] = ev.slab_out.pack(service.inputs(shape, seed))
        reply = ev.ask(msg, "forward", shape.limits.call_s, seed=slot, **where)
        if not reply["ok"]:
            if reply.get("verdict") == "incorrect":
                row.update(correct=False, problem=f"seed {slot}: {reply.get('message')}")
                return None
            return reply
        for out_name, err in prepared.baseline_err.items():
            base_by[out_name] = max(base_by.get(out_name, 0.0), err)
        row["baseline_rel_err"] = max(base_by.values(), default=0.0)
        if ev.generate and reply.get("fingerprint") != prepared.fingerprint:
            return {"verdict": "forbidden", "message": "the inputs in the candidate process differ from the "
                    "service's (fingerprint mismatch): make_inputs was altered there, or it is not deterministic"}
        row["seeds_checked"] += 1
        row.setdefault("call_ms", []).append(round(float(reply.get("ms", 0.0)), 3))  # the first holds compiles
        if reply.get("mutated"):
            row.update(correct=False, problem=f"seed {slot}: forward modified its input(s) "
                                              f"{', '.join(map(str, reply['mutated']))} in place")
            return None
        outs = ev.tensors(reply["outputs"])
        verdict = checks.compare(outs, reply["meta"], prepared.expected, prepared.dtypes, names, tols, ev.device)
        for out_name, err in verdict["rel_err"].items():
            if err is not None:
                err = err if err == err else math.inf  # NaN compares false with everything; inf sorts last
                row["rel_err"] = err if row["rel_err"] is None else max(row["rel_err"], err)
                cand_by[out_name] = max(cand_by.get(out_name, 0.0), err)
        if not verdict["ok"]:
            row.update(correct=False, problem=f"seed {slot}: {verdict['problem']}")
            return None
        if reply.get("ops"):
            row.update(forbidden=reply["ops_message"], ops=reply["ops"])
            return None
        del outs
    row["correct"] = True
    row["rel_err_by_output"], row["baseline_rel_err_by_output"] = cand_by, base_by
    ev.warnings.extend(precision_warnings(row, name, dict(zip(names, tols))))
    return None


def precision_warnings(row: dict[str, Any], name: str, tols: dict[str, float]) -> list[str]:
    """Compare the candidate's error with the baseline's on the same inputs, output by output, each against its
    own tolerance (HARNESS.md L2); sets the row's err_ratio and precision_flag and returns the warnings."""
    from workbench.evaluator.verdict import PRECISION_RATIO, PRECISION_TOL_FRACTION

    warnings = []
    cand_by, base_by = row.get("rel_err_by_output") or {}, row.get("baseline_rel_err_by_output") or {}
    ratios = {}
    for out, tol in tols.items():
        cand, base = cand_by.get(out), base_by.get(out)
        if base is not None and base > 0.8 * tol:
            warnings.append(f"{name}: the baseline's own error on {out}, {base:.2g}, is above 0.8x its "
                            f"tolerance {tol:.2g}")
        if cand is None or base is None:
            continue
        ratios[out] = cand / base if base > 0 else (math.inf if cand > 0 else 1.0)
        if ratios[out] > PRECISION_RATIO and cand > PRECISION_TOL_FRACTION * tol:
            row["precision_flag"] = True
            warnings.append(f"{name}: candidate error on {out}, {cand:.2g}, is {ratios[out]:.3g}x the "
                            f"baseline's {base:.2g} (lower precision than the baseline?)")
    if ratios:
        row["err_ratio"] = max(ratios.values())
    return warnings
