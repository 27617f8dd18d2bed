"""Turn the trusted harness's measurements into the contract result: per-shape rows, verdict, message, speedup."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from workbench.devices import peaks_for
from workbench.plain import map_leaves

if TYPE_CHECKING:
    from workbench.tasks import Task

PRECISION_RATIO = 2.0
"""A candidate whose error is more than this many times the baseline's on the same inputs is flagged (L2) ..."""
PRECISION_TOL_FRACTION = 0.25
"""... once its error is also a visible part of the tolerance (an fp32 kernel at 3e-7 against torch's 1e-7 is
rounding noise, not a downcast)."""
QUARANTINE_FLOOR_MARGIN = 1.1
"""A time within 10% of the roofline floor is physically possible but needs review before it can count as best."""

_ROW_EXTRAS = ("ms_iqr", "ms_min", "baseline_ms_iqr", "wall_ms", "baseline_wall_ms", "reps", "blocks", "speedup_ci",
               "precision", "baseline_rel_err", "err_ratio", "precision_flag", "seeds_checked", "spot_checks",
               "revalidated", "call_ms", "problem", "rel_err_by_output", "baseline_rel_err_by_output", "graph_ms",
               "graph_ms_iqr", "baseline_graph_ms", "baseline_graph_ms_iqr", "graph_error", "baseline_graph_error")


def clean(value: Any) -> Any:
    """Replace NaN/inf floats (anywhere in nested data) by None, so the result is strict JSON."""
    return map_leaves(value, lambda v: None if isinstance(v, float) and not math.isfinite(v) else v)


def geomean(values: list[float]) -> float | None:
    """Geometric mean of positive values; None when there are none or one is not positive."""
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def shape_entry(row: dict[str, Any], task: "Task", device: str, gpu: str | None = None) -> dict[str, Any]:
    """One contract shape entry (plus extras) from a harness row; gpu names the GPU for the roofline floor."""
    ms, base = row.get("ms"), row.get("baseline_ms")
    speedup = base / ms if isinstance(ms, (int, float)) and isinstance(base, (int, float)) and ms > 0 else None
    entry = {
        "name": row["name"],
        "correct": row.get("correct"),
        "rel_err": row.get("rel_err"),
        "ms": ms,
        "baseline_ms": base,
        "speedup": speedup,
        "floor_ms": task.floor_ms(row["name"], device, gpu),
    }
    entry.update({k: row[k] for k in _ROW_EXTRAS if k in row})
    g, gb = row.get("graph_ms"), row.get("baseline_graph_ms")
    if isinstance(g, (int, float)) and isinstance(gb, (int, float)) and g > 0:
        entry["graph_speedup"] = gb / g
    return entry


def _where(stage: dict[str, Any]) -> str:
    if not stage or "shape" not in stage:
        return ""
    parts = [f"shape {stage['shape']}"]
    if stage.get("seed") is not None:
        parts.append(f"seed {stage['seed']}")
    return " (" + ", ".join(parts) + ")"


def _best_ms(row: dict[str, Any], graph_key: str, event_ms: float | None) -> float | None:
    """The faster of a side's event and CUDA-graph times: plausibility is judged on GPU time.

    A launch-bound baseline's event window is mostly host gaps (FLA at small held-out shapes: 1.3 ms of events
    around 0.09 ms of kernels), which would make any honest candidate look implausibly fast. Taking each side's
    faster time keeps the check strict: a candidate fast in either mode is judged on that.
    """
    graph = row.get(graph_key)
    times = [t for t in (event_ms, graph) if isinstance(t, (int, float)) and t > 0]
    return min(times) if times else None


def judge(
    task: "Task",
    device: str,
    rows: list[dict[str, Any]],
    failure: dict[str, Any] | None,
    baseline: str,
    gpu: str | None = None,
) -> tuple[str, str, list[str]]:
    """Decide the verdict and its one-line message; gpu names the GPU whose peaks bound the times (CUDA).

    Returns:
        (verdict, message, warnings).
    """
    warnings: list[str] = []
    if failure is not None:
        message = failure["message"]
        if failure.get("stage", {}).get("stage") in ("forward", "warmup", "timing", "revalidate"):
            message += _where(failure["stage"])
        return failure["verdict"], message, warnings
    bad = [r for r in rows if r.get("correct") is False]
    if bad:
        first = bad[0]
        label = "held-out shape" if first.get("role") == "heldout" else "shape"
        count = f" ({len(bad)} of {len(rows)} shapes fail)" if len(bad) > 1 else ""
        return "incorrect", f"incorrect on {label} {first['name']}, {first.get('problem')}{count}", warnings
    # Provenance found at run time (dispatched torch ops, foreign kernels, escaped work) is judged on results that
    # would otherwise count: a wrong result is reported as wrong, the more actionable message.
    forbidden = [r for r in rows if r.get("forbidden")]
    if forbidden:
        return "forbidden", f"{forbidden[0]['forbidden']} (shape {forbidden[0]['name']})", warnings
    if device == "cuda":
        peaks = peaks_for(gpu)
        if not peaks.known:
            warnings.append(f"GPU {gpu or '?'} is not in the peak table: roofline floors use the largest known "
                            f"peaks ({peaks.bytes_per_s / 1e12:g} TB/s, {peaks.flops_per_s / 1e12:g} TFLOP/s), "
                            "so they are lower than this GPU's own")
        for row in rows:
            ms, floor = row.get("ms"), task.floor_ms(row["name"], "cuda", gpu)
            if ms is None:
                continue
            best, base = _best_ms(row, "graph_ms", ms), _best_ms(row, "baseline_graph_ms", row.get("baseline_ms"))
            if floor is not None and best < floor:
                return ("implausible",
                        f"implausible: {row['name']} took {best:.4g} ms, under the roofline floor {floor:.4g} ms",
                        warnings)
            if base and best > 0 and base / best > task.plausible_speedup:
                return ("implausible",
                        f"implausible: {row['name']} is {base / best:.3g}x faster than {baseline}, above the task's "
                        f"plausible_speedup {task.plausible_speedup:g}x; needs review before it can count",
                        warnings)
            event_base = row.get("baseline_ms")
            if event_base and ms > 0 and event_base / ms > task.plausible_speedup:
                warnings.append(f"{row['name']}: {event_base / ms:.3g}x by events but {base / best:.3g}x in GPU time "
                                f"under CUDA graphs: the baseline's event time is mostly launch gaps")
            _, nbytes = task.work(row["name"])
            tb_s = nbytes / (ms * 1e-3) / 1e12
            if tb_s > peaks.real_bytes_per_s / 1e12:
                how = "measured copy rate" if peaks.measured else "realistic bandwidth"
                warnings.append(f"{row['name']}: implied bandwidth {tb_s:.2f} TB/s is above the {peaks.gpu}'s {how} "
                                f"{peaks.real_bytes_per_s / 1e12:.3g} TB/s")
    return "ok", "", warnings


def quarantine(task: "Task", device: str, verdict: str, rows: list[dict[str, Any]],
               gpu: str | None = None) -> str | None:
    """Why a result must stay unverified until a person reviews it (HARNESS.md T8), or None.

    Implausible results are always quarantined; an "ok" one is when a shape runs within 10% of its roofline floor
    by events or under a CUDA graph.
    """
    if verdict == "implausible":
        return "implausible timing"
    if verdict != "ok" or device != "cuda":
        return None
    for row in rows:
        ms, floor = _best_ms(row, "graph_ms", row.get("ms")), task.floor_ms(row["name"], "cuda", gpu)
        if ms is not None and floor is not None and ms < QUARANTINE_FLOOR_MARGIN * floor:
            return f"{row['name']} runs within {100 * (QUARANTINE_FLOOR_MARGIN - 1):.0f}% of its roofline floor"
    return None
