"""`workbench task check NAME`: run a task's reference and baseline on its shapes and list what is wrong.

Each problem is one line naming the task.toml field or file it concerns. Real runs use the shapes this machine can
evaluate (the interpreter shapes on a CPU, the CUDA shapes on a GPU); memory is estimated for every shape on the
meta device where the task's make_inputs supports it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.tasks import probe
from workbench.tasks.model import Task

WARN_FRACTION = 0.8
"""The evaluator warns when the baseline's own error is above this fraction of the tolerance."""
SEEDS = (0, 1, 2)
TIMING_REPS = 20


@dataclass
class ShapeReport:
    """One shape's figures."""

    group: str
    name: str
    baseline_err: float | None = None
    memory: int | None = None
    ms: float | None = None
    compiled_ms: float | None = None
    status: str = "ok"


@dataclass
class CheckReport:
    """What `task check` found."""

    task: str
    device: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    shapes: list[ShapeReport] = field(default_factory=list)
    elapsed_s: float = 0.0

    def lines(self) -> list[str]:
        """The report as printed."""
        out = [f"{'shape':<16} {'baseline err':>12} {'tolerance':>10} {'memory':>10} {'eager ms':>9} "
               f"{'compile ms':>10}  status"]
        for s in self.shapes:
            err = f"{s.baseline_err:.3g}" if s.baseline_err is not None else "-"
            mem = probe.gib(s.memory) if s.memory is not None else "-"
            ms = f"{s.ms:.4g}" if s.ms is not None else "-"
            cms = f"{s.compiled_ms:.4g}" if s.compiled_ms is not None else "-"
            out.append(f"{s.group + ' ' + s.name:<16} {err:>12} {self._tol:>10} {mem:>10} {ms:>9} {cms:>10}  {s.status}")
        out += [f"note: {n}" for n in self.notes]
        out += [f"problem: {p}" for p in self.problems]
        verdict = "ok" if not self.problems else f"{len(self.problems)} problem(s)"
        out.append(f"task {self.task}: {verdict} ({self.device}, {self.elapsed_s:.1f} s)")
        return out

    _tol: str = ""


def _meta_memory(ref: Any, params: dict[str, Any]) -> int | None:
    try:
        stats = probe.meta_run(ref.make_inputs, ref.forward, params, "memory estimate")
    except probe.ProbeError:
        return None
    return probe.memory_bytes(stats, stats)


def _time(fn: Any, inputs: dict[str, Any], device: str) -> float | None:
    """Median ms of one call (CUDA events); None on the CPU, where the interpreter makes timings meaningless."""
    if device != "cuda":
        return None
    times = []
    for _ in range(3):
        fn(**inputs)
    torch.cuda.synchronize()
    for _ in range(TIMING_REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(**inputs)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def check_task(task: Task, device: str, compile_column: bool = False) -> CheckReport:
    """Run the checks; never raises for a broken task (its problems are in the report)."""
    started = time.monotonic()
    report = CheckReport(task=task.name, device=device)
    report._tol = f"{task.tolerance['value']:.3g}"
    try:
        ref = probe.load_file(task.reference, f"workbench_check_reference_{task.name}")
    except Exception as exc:  # noqa: BLE001 - a broken reference is what this command reports
        report.problems.append(f"reference.py: importing it raised {probe.describe(exc)}")
        report.elapsed_s = time.monotonic() - started
        return report
    base_fn, base_name = ref.forward, "the reference"
    compiled = None
    if task.baseline is not None:
        try:
            base = probe.load_file(task.baseline, f"workbench_check_baseline_{task.name}")
            if base.available():
                base_fn, base_name = base.forward, str(base.NAME)
                compiled = getattr(base, "compiled", None) if compile_column else None
            else:
                report.notes.append(f"baseline {base.NAME} is not available here; checked against the reference")
        except Exception as exc:  # noqa: BLE001
            report.problems.append(f"baseline.py: importing it raised {probe.describe(exc)}")
    if compile_column and compiled is None:
        report.notes.append("baseline.py has no compiled() variant: no torch.compile column")

    real_groups = ("cuda", "heldout") if device == "cuda" else ("cpu", "heldout_cpu")
    limit = probe.available_memory(device)
    cuda_limit = probe.available_memory("cuda") if torch.cuda.is_available() else 141e9
    for group in ("cuda", "heldout", "cpu", "heldout_cpu"):
        for shape in task.shapes.get(group, []):
            row = ShapeReport(group=group, name=shape.name)
            report.shapes.append(row)
            where = f"shapes.{group} {shape.name}"
            row.memory = _meta_memory(ref, shape.params)
            dev_limit = cuda_limit if group in ("cuda", "heldout") else limit
            if row.memory is not None and row.memory > dev_limit:
                row.status = "too big"
                report.problems.append(f"{where}: needs about {probe.gib(row.memory)} to evaluate, more than the "
                                       f"{probe.gib(dev_limit)} the device has")
                continue
            if group not in real_groups:
                row.status = "meta only" if row.memory is not None else "not run here"
                continue
            problem = _check_shape(task, ref, base_fn, base_name, compiled, shape.params, where, device, row)
            if problem:
                row.status = "problem"
                report.problems.append(problem)
    if not any(s.status != "meta only" and s.status != "not run here" for s in report.shapes):
        report.notes.append(f"no shape of {task.name} runs on {device}")
    seed_text = task.seed.read_text(encoding="utf-8")
    if "NotImplementedError" in seed_text and "placeholder" in seed_text:
        report.notes.append("seed.py is a placeholder: the offline tuner needs a seed with TUNABLES; the claude "
                            "agent can start from it")
    report.elapsed_s = time.monotonic() - started
    return report


def tolerance_problem(name: str, err: float, tol: float, where: str) -> str | None:
    """Whether the baseline's own error leaves a correct kernel of its precision room under the tolerance: above it
    none could pass; above WARN_FRACTION of it one would fail on unlucky inputs. The suggested value is the least
    that clears the warning (rounded up), so a person does not loosen a check more than the baseline needs."""
    if not err <= tol:
        return (f"tolerance.value: the baseline's own error on {name}, {err:.3g}, is above the tolerance {tol:.3g} on "
                f"{where}: no correct kernel of the same precision could pass")
    if err > WARN_FRACTION * tol:
        least = float(f"{err / WARN_FRACTION:.2g}")
        if least * WARN_FRACTION < err:
            least = float(f"{least + 10 ** (math.floor(math.log10(least)) - 1):.2g}")
        return (f"tolerance.value: the baseline's own error on {name}, {err:.3g}, is above {WARN_FRACTION}x the "
                f"tolerance {tol:.3g} on {where}; raise it to at least {least:.2g}")
    return None


def _check_shape(task: Task, ref: Any, base_fn: Any, base_name: str, compiled: Any, params: dict[str, Any],
                 where: str, device: str, row: ShapeReport) -> str | None:
    """One shape's real checks; the first problem found, as one line."""
    from workbench.evaluator.inputs import fingerprint

    names = task.outputs
    worst = 0.0
    for seed in SEEDS:
        try:
            inputs = ref.make_inputs(dict(params), seed, device)
            again = ref.make_inputs(dict(params), seed, device)
        except Exception as exc:  # noqa: BLE001
            return f"reference.py: make_inputs raised {probe.describe(exc)} on {where}"
        if fingerprint(inputs) != fingerprint(again):
            return f"reference.py: make_inputs gives different inputs for the same seed on {where}"
        try:
            out = probe.real_outputs(ref.forward, inputs, f"reference.py: forward on {where}", 600)
            out2 = probe.real_outputs(ref.forward, inputs, f"reference.py: forward on {where}", 600)
        except probe.ProbeError as exc:
            return str(exc)
        if len(out) != len(names):
            return f"outputs: task.toml lists {len(names)} ({', '.join(names)}), forward returns {len(out)} on {where}"
        diff = probe.same(out, out2)
        if diff > 0:
            return f"reference.py: not deterministic: two runs on the same inputs differ (rel_rms {diff:.3g}) on {where}"
        for name, t in zip(names, out):
            if t.numel() == 0 or not bool(torch.isfinite(t).all()) or float(torch.linalg.vector_norm(
                    t.to(torch.float64))) == 0.0:
                return f"outputs.{name}: the reference's output is empty, non-finite or all zeros on {where}"
        try:
            base = probe.real_outputs(base_fn, inputs, f"baseline.py ({base_name}) on {where}", 600)
        except probe.ProbeError as exc:
            return str(exc)
        if len(base) != len(out):
            return f"baseline.py: returns {len(base)} outputs, the reference {len(out)} on {where}"
        for name, r, b in zip(names, out, base):
            err = probe.rel_rms(r, b)
            tol = task.tol(name)
            worst = max(worst, err)
            problem = tolerance_problem(name, err, tol, f"{where} (seed {seed})")
            if problem:
                return problem
    row.baseline_err = worst
    row.ms = _time(base_fn, inputs, device)
    if compiled is not None:
        try:
            got = probe.real_outputs(compiled, inputs, f"baseline.py compiled() on {where}", 600)
        except probe.ProbeError as exc:
            row.status = "no compile"
            return f"{exc} (the torch.compile column)"
        bad = [n for n, r, g in zip(names, out, got) if not probe.rel_rms(r, g) <= task.tol(n)]
        if bad:
            return f"baseline.py: compiled() is outside the tolerance on {', '.join(bad)} on {where}"
        row.compiled_ms = _time(compiled, inputs, device)
    return None
