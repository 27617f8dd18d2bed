"""Turn how one evaluation went (the service's measurements, or a timeout or crash) into the contract result."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.evaluator import stats
from workbench.evaluator import verdict as verdicts
from workbench.evaluator.submission import Submission, base_result

if TYPE_CHECKING:
    from workbench.evaluator.result import EvalResult
    from workbench.tasks import Task


@dataclass
class Outcome:
    """How one run through the service ended, as the owner saw it."""

    kind: str
    """"result" (measurements came back), "timeout", "crash" (the candidate process died), "harness_error"."""
    final: dict[str, Any] = field(default_factory=dict)
    """The service's final message ("result" kind)."""
    message: str = ""
    stage: dict[str, Any] = field(default_factory=dict)
    """The step under way when it ended."""
    env: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds per announced step name."""
    prestarted: bool = False
    start: str = ""
    """How the candidate process started (forked from a template, or a fresh interpreter and why)."""
    worker: dict[str, Any] = field(default_factory=dict)
    """The candidate process's ready report (its isolation)."""
    logs_dir: str | None = None
    traceback: str | None = None


def build(task: "Task", sub: Submission, device: str, seeds: int, heldout: bool, outcome: Outcome,
          service: dict[str, Any]) -> "EvalResult":
    """The evaluator contract result for one evaluation (EvalResult)."""
    result = base_result(task, sub, device, seeds)
    result["prestarted"] = outcome.prestarted
    if outcome.logs_dir:
        result["logs_dir"] = outcome.logs_dir
    env = outcome.final.get("env") or outcome.env
    if env:
        result["env"] = env
        if device == "cuda" and env.get("gpu"):
            result["device"] = f"cuda:{env['gpu']}"
    result["baseline"] = outcome.final.get("baseline")
    result["phases_s"] = outcome.phases
    result["isolation"] = {"env_allowlist": True, "netns": bool(outcome.worker.get("netns")),
                           "netns_note": outcome.worker.get("netns_note"), "candidate_triton_cache": True,
                           "start": outcome.start}
    result["service"] = {**(outcome.final.get("service") or {}), **service}

    def done(verdict: str, message: str, **extra: Any) -> "EvalResult":
        result.update(verdict=verdict, message=message, **extra)
        result["elapsed_s"] = round(time.monotonic() - sub.started, 3)
        return verdicts.clean(result)

    if outcome.kind in ("timeout", "crash"):
        extra = {"harness_error": True} if outcome.final.get("harness_error") else {}
        return done(outcome.kind, outcome.message, **extra)
    if outcome.kind == "harness_error":
        return done("crash", outcome.message, harness_error=True, traceback=outcome.traceback)

    final = outcome.final
    rows = final["rows"]
    gpu = (env or {}).get("gpu")
    public = [r for r in rows if r.get("role") == "public"]
    hidden = [r for r in rows if r.get("role") == "heldout"]
    result["shapes"] = [verdicts.shape_entry(r, task, device, gpu) for r in public]
    if heldout:
        result["heldout"] = [verdicts.shape_entry(r, task, device, gpu) for r in hidden]
    verdict, message, warnings = verdicts.judge(task, device, rows, final["failure"], final["baseline"], gpu)
    timed = all(e["speedup"] is not None for e in result["shapes"]) and result["shapes"]
    result["speedup"] = verdicts.geomean([e["speedup"] for e in result["shapes"]]) if timed else None
    cis = [stats.RatioCI(e["speedup"], *e["speedup_ci"]) for e in result["shapes"] if e.get("speedup_ci")]
    overall = stats.geomean_ci(cis) if timed and len(cis) == len(result["shapes"]) else None
    if overall is not None:
        result["speedup_ci"] = [overall.low, overall.high]
        target = final["timing"].get("precision_target")
        achieved = max(e["precision"] for e in result["shapes"])
        result["precision"] = {"target": target, "worst_shape": achieved,
                               "met": target is not None and achieved <= target, "geomean": overall.rel_halfwidth}
    if heldout and result["heldout"] and all(e["speedup"] is not None for e in result["heldout"]):
        result["heldout_speedup"] = verdicts.geomean([e["speedup"] for e in result["heldout"]])
    for key in ("timing", "limits", "cache", "compiles"):
        if final.get(key) is not None:
            result[key] = final[key]
    result["seeding"] = final.get("seeds")
    result["warnings"] = list(final.get("warnings", [])) + warnings
    reason = verdicts.quarantine(task, device, verdict, rows, gpu)
    result["quarantined"] = reason is not None
    if reason:
        result["quarantine_reason"] = reason
    if device == "cuda" and any(r.get("ms") is not None for r in public):
        from workbench.profiler import summary

        result["profile"] = summary.build(task, public, final.get("compile") or [], (env or {}).get("sms"), gpu)
    if verdict == "ok":
        n = len(public) + (len(hidden) if heldout else 0)
        message = f"correct on {n} shapes x {seeds} seeds"
        if result["speedup"] is not None:
            message += f"; speedup {result['speedup']:.3g}x vs {final['baseline']} (geomean"
            message += f", 95% CI {overall.low:.3g}-{overall.high:.3g})" if overall is not None else ")"
        if device == "cpu":
            message += "; interpreter timings are not comparable"
    return done(verdict, message)
