"""The evaluation result: one typed definition that the evaluator writes and the journal, prompts and TUI read.

A result travels as plain JSON (the `workbench eval --json` contract, `eval.finished` in the journal), so these are
TypedDicts over that JSON rather than classes. Every reader takes its key lists from here: a renamed key is then a
change the type checker and the replay tests see, not a silent hole in an old journal's replay.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

RESULT_VERSION = 1
"""Bumped when a key's meaning changes; readers of older journals keep working because keys are only added."""

Verdict = Literal["ok", "compile_error", "incorrect", "forbidden", "timeout", "crash", "implausible"]


class ShapeResult(TypedDict, total=False):
    """One shape of an evaluation: correctness, then timing against the baseline measured in the same run."""

    name: str
    correct: bool | None
    rel_err: float | None
    ms: float | None
    baseline_ms: float | None
    speedup: float | None
    floor_ms: float | None
    ms_iqr: float
    ms_min: float
    baseline_ms_iqr: float
    wall_ms: float
    baseline_wall_ms: float
    reps: int
    blocks: int
    """Interleaved blocks per side the timing took (until the speedup was known, or a bound was reached)."""
    speedup_ci: list[float]
    """[low, high]: a 95% interval of the speedup (order statistics of both sides' reps; CUDA only)."""
    precision: float
    """Half the interval's width over the speedup (0.01: known to +-1%)."""
    baseline_rel_err: float
    err_ratio: float
    precision_flag: bool
    seeds_checked: int
    spot_checks: int
    revalidated: bool
    call_ms: list[float]
    problem: str
    rel_err_by_output: dict[str, float]
    baseline_rel_err_by_output: dict[str, float]
    graph_ms: float
    graph_ms_iqr: float
    baseline_graph_ms: float
    baseline_graph_ms_iqr: float
    graph_speedup: float
    graph_error: str
    baseline_graph_error: str
    profile: dict[str, Any]


class MeasuredOn(TypedDict):
    """Where an evaluation ran (workbench.fleet): a speedup is only compared with speedups of like GPUs."""

    slot: str
    """The pool's slot name ("cuda:0", "cpu:1", "ray:host-b:cuda:3")."""
    device: str
    gpu: str | None
    """The GPU's index on its host (nvidia-smi's), None on the CPU."""
    gpu_name: str | None
    host: str
    """The machine's name (never empty, unlike a local SlotInfo's host)."""


class EvalResult(TypedDict, total=False):
    """What evaluate() returns (ARCHITECTURE.md, evaluator contract) plus the extras a run journals."""

    task: str
    file: str
    sha256: str
    device: str
    verdict: Verdict
    message: str
    shapes: list[ShapeResult]
    speedup: float | None
    timing_comparable: bool
    baseline: str | None
    seeds: int
    heldout: list[ShapeResult]
    heldout_speedup: float
    timing: dict[str, Any]
    env: dict[str, Any]
    warnings: list[str]
    findings: list[dict[str, Any]]
    quarantined: bool
    quarantine_reason: str
    profile: dict[str, Any]
    phases_s: dict[str, float]
    elapsed_s: float
    prestarted: bool
    harness_error: bool
    traceback: str
    static_guards: bool
    logs_dir: str
    speedup_ci: list[float]
    """[low, high]: a 95% interval of the geomean speedup (per-shape intervals combined in log space)."""
    precision: dict[str, Any]
    """{"target", "worst_shape", "geomean", "met"}: how precisely the speedups are known, against the target."""
    limits: dict[str, Any]
    """The time limits this evaluation ran under ({"evaluation_s", "compile_s", "shapes": {name: {...}}})."""
    cache: dict[str, int]
    """The service's oracle cache during this evaluation: hits, misses, evictions, and its bytes and entries."""
    seeding: dict[str, Any]
    """{"secret", "pool", "fresh_sets", "refresh_every"}: how correctness and timing inputs were drawn."""
    isolation: dict[str, Any]
    """Which layers held the candidate process ({"env_allowlist", "netns", "netns_note", ...}) and how it started
    ("start": forked from a template, or a fresh interpreter and why)."""
    service: dict[str, Any]
    """The evaluation service: its evaluations, restarts, re-runs of this one, pid, time spent."""
    compiles: list[dict[str, Any]]
    """Triton compiles the candidate process reported ({"kernel", "s"}), which the time limits allowed for."""
    measured_on: MeasuredOn
    """The slot, GPU and host the evaluation ran on (set by the evaluation pool's slot, not by the service)."""
    observed: dict[str, Any]
    """A passing held-out check's kernel list from outside the candidate process, by its slot (workbench.fleet.observe):
    {"observer", "shape", "kernels", "problems"}, or {"error"} when the observer could not run."""


CONTRACT_KEYS: tuple[str, ...] = ("task", "file", "sha256", "device", "verdict", "message", "shapes", "speedup",
                                  "timing_comparable")
"""The keys `workbench eval --json` always prints (ARCHITECTURE.md)."""

PUBLIC_KEYS: tuple[str, ...] = (*CONTRACT_KEYS, "baseline")
"""The parts of a held-out check that may be journaled where the agent can see them."""

AGENT_SHAPE_KEYS: tuple[str, ...] = ("name", "correct", "rel_err", "ms", "baseline_ms", "speedup", "floor_ms",
                                     "graph_ms", "baseline_graph_ms", "graph_speedup")
"""Per-shape figures an agent acts on; the full row stays in eval.finished."""


def public_part(result: EvalResult) -> EvalResult:
    """The result cut to PUBLIC_KEYS (what a held-out check may show the agent)."""
    return {k: result[k] for k in PUBLIC_KEYS if k in result}  # type: ignore[literal-required, return-value]


def agent_report(result: EvalResult) -> dict[str, Any]:
    """The result cut to what the agent acts on: verdict, message, geomean and the per-shape figures."""
    return {
        "verdict": result.get("verdict"),
        "message": result.get("message", ""),
        "speedup": result.get("speedup"),
        "timing_comparable": bool(result.get("timing_comparable")),
        "shapes": [{k: s[k] for k in AGENT_SHAPE_KEYS if s.get(k) is not None}  # type: ignore[literal-required]
                   for s in result.get("shapes", [])],
    }
