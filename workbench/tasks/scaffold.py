"""Build a task folder from a problem: shapes, a calibrated tolerance, roofline formulas, forbidden ops, files.

Every source (`task new`, the KernelBench and FlashInfer-Bench importers) describes its problem as a Spec; this module
does the rest the same way for all of them. The folder is written under a temporary name beside its destination and
renamed into place only once it loads strictly and its reference has run on every CPU shape, so a failure never
leaves half a task behind.
"""

from __future__ import annotations

import itertools
import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Callable

from workbench.tasks import probe, templates
from workbench.tasks.model import TaskError

CPU_MAX_ELEMENTS = 65536
"""Largest tensor (input or output) a CPU shape may hold: the Triton interpreter runs every program in numpy."""
CPU_MAX_FLOPS = 2e7
"""Most FLOPs (by torch's counter) a CPU shape may cost."""
SMALL_PARAM = 8
"""Size params at or below this are kept as they are (kernel sizes, strides, a reduction's dim index)."""
CALIBRATE_MAX_FLOPS = 2e10
"""A CUDA shape is also calibrated on this machine's CPU when its fp64 run costs at most this many FLOPs..."""
CALIBRATE_MAX_BYTES = 2 << 30
"""... and its evaluation fits in this much memory; larger ones are left to `task check` on a GPU."""
MARGIN = 5.0
"""tolerance = MARGIN x the worst error of the problem's own precision against the oracle ..."""
FLOOR_EPS = {"float32": 4.0, "float64": 1000.0}
"""... but at least this many epsilons of the output dtype (default 1): for bf16 and fp16 the output rounding dominates
(two independent roundings differ by about 0.4 eps rms); fp32 and fp64 results carry accumulation-order noise too."""
MAX_OWN_ERROR = 0.5
"""A problem whose own precision is further than this from the oracle has no usable tolerance (HARNESS.md C7)."""
H200_MEMORY = 141e9
"""The benchmark GPU's memory, for CUDA shapes checked on a machine without a GPU."""
SEEDS = (0, 1, 2)
"""The seeds calibration runs, as the evaluator does."""
RUN_TIMEOUT_S = 120.0
"""Longest one reference call may take on this machine before the shape is reported as too slow."""
FORBIDDEN_IMPORTS = ["fla", "flash_attn", "flash_mla", "flash_kda", "flashinfer", "xformers", "apex", "liger_kernel"]
"""Kernel libraries no candidate may import (the shipped tasks' list)."""


@dataclass
class Spec:
    """A problem ready to become a task folder."""

    name: str
    description: str
    problem_source: str
    """The text of problem.py: the problem's own file, copied unchanged."""
    adapter: templates.Adapter
    cuda: list[dict[str, Any]]
    """Params of each CUDA (benchmark) shape: what make_inputs receives."""
    command: str
    """The command that generated it, for the files' headers."""
    scalable: list[str] | None = None
    """Params that scaling and perturbation may change (default: every int param above SMALL_PARAM)."""
    extra_files: dict[str, str] = field(default_factory=dict)
    """Other files the problem needs beside problem.py (name -> text), copied unchanged."""
    output_axes: list[list[str] | None] | None = None
    """Per output, the shape params its dimensions must equal (a Definition's named axes), checked on every shape."""
    check_compile: bool = False
    """Also try torch.compile of the baseline on a CPU shape (about 20 s on a small CPU for the C++ build)."""


@dataclass
class Built:
    """What build() made and measured, for the command to print."""

    folder: Path
    shapes: dict[str, list[dict[str, Any]]]
    tolerance: dict[str, float]
    calibration: list[str]
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


class OracleError(probe.ProbeError):
    """The problem runs in its own precision but not in the oracle's: try a narrower oracle."""


class _Probe:
    """The generated reference and baseline of a folder being built, loaded, with the measurements taken so far."""

    def __init__(self, folder: Path, name: str):
        self.reference = probe.load_file(folder / "reference.py", f"workbench_scaffold_reference_{name}")
        self.baseline = probe.load_file(folder / "baseline.py", f"workbench_scaffold_baseline_{name}")

    def meta(self, params: dict[str, Any], what: str, oracle: bool = False) -> probe.MetaStats:
        fn = self.reference.forward if oracle else self.baseline.forward
        return probe.meta_run(self.reference.make_inputs, fn, params, what)

    def real(self, params: dict[str, Any], seed: int, what: str) -> tuple[list[Any], list[Any], dict[str, Any]]:
        """(baseline outputs, oracle outputs, inputs) of one shape and seed on the CPU."""
        try:
            inputs = self.reference.make_inputs(dict(params), seed, "cpu")
        except Exception as exc:  # noqa: BLE001 - the problem's own input code
            raise probe.ProbeError(f"make_inputs raised {probe.describe(exc)} on {what}") from None
        base = probe.real_outputs(self.baseline.forward, inputs, f"the problem ({what})", RUN_TIMEOUT_S)
        try:
            ref = probe.real_outputs(self.reference.forward, inputs, f"the reference ({what})", RUN_TIMEOUT_S)
        except probe.ProbeError as exc:
            raise OracleError(str(exc)) from None
        return base, ref, inputs


def _fits_cpu(stats: probe.MetaStats) -> bool:
    return max(stats.numels, default=0) <= CPU_MAX_ELEMENTS and stats.flops <= CPU_MAX_FLOPS


def _scalable(spec: Spec) -> list[str]:
    if spec.scalable is not None:
        return list(spec.scalable)
    first = spec.cuda[0]
    return [k for k, v in first.items()
            if isinstance(v, int) and not isinstance(v, bool) and any(s.get(k, 0) > SMALL_PARAM for s in spec.cuda)]


def _valid_cpu(p: _Probe, params: dict[str, Any], what: str) -> probe.MetaStats | None:
    """Meta stats of a candidate CPU shape when it fits the interpreter budget and really runs, else None."""
    try:
        stats = p.meta(params, what)
    except probe.ProbeError:
        return None
    if not _fits_cpu(stats):
        return None
    try:
        p.real(params, 0, what)
    except probe.ProbeError:
        return None
    return stats


def _scale_down(p: _Probe, params: dict[str, Any], names: list[str]) -> dict[str, Any] | None:
    """The least-scaled version of a shape (every scalable param divided by the same power of two) that fits."""
    previous = None
    for k in range(0, 21):
        trial = dict(params)
        for n in names:
            if params[n] > SMALL_PARAM:
                trial[n] = max(1, params[n] // 2 ** k)
        if trial == previous:
            continue
        previous = trial
        if _valid_cpu(p, trial, "a CPU shape") is not None:
            return trial
    return _scale_greedy(p, params, names)


def _scale_greedy(p: _Probe, params: dict[str, Any], names: list[str]) -> dict[str, Any] | None:
    """Halve the largest scalable param at a time, keeping each halving the problem accepts, until the shape fits.

    Reaches shapes a common factor cannot, where sizes are tied by divisibility (channels and groups).
    """
    current = dict(params)
    frozen: set[str] = set()
    for _ in range(400):
        try:
            stats = p.meta(current, "a CPU shape")
        except probe.ProbeError:
            return None
        if _fits_cpu(stats):
            return current if _valid_cpu(p, current, "a CPU shape") is not None else None
        open_ = [n for n in names if n not in frozen and current[n] > 1]
        if not open_:
            return None
        n = max(open_, key=lambda k: current[k])
        trial = {**current, n: current[n] // 2}
        try:
            p.meta(trial, "a CPU shape")
            current = trial
        except probe.ProbeError:
            frozen.add(n)
    return None


def _perturb(p: _Probe, params: dict[str, Any], names: list[str], step: Callable[[int], int],
             check: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """Move each scalable param to an odd size, one at a time, keeping each move the problem accepts."""
    current = dict(params)
    moved = False
    for n in names:
        value = current[n]
        if not isinstance(value, int) or value <= 2:
            continue
        new = step(value)
        if new % 2 == 0:
            new += 1
        if new == value or new < 1:
            continue
        trial = {**current, n: new}
        if check(trial):
            current, moved = trial, True
    return current if moved else None


def _heldout_step(value: int) -> int:
    return value + max(1, value // 16)


def _cpu_odd_step(value: int) -> int:
    return value + 1


def _heldout_cpu_step(value: int) -> int:
    return value + 2 if value > 3 else value + 1


def _fit_monomial(values: list[float], rows: list[dict[str, Any]], names: list[str]) -> str | None:
    """A formula c * p1 * p2 ... (params from `names`) that gives `values` on every row exactly, or None."""
    if all(v == 0 for v in values):
        return "0"
    if any(v <= 0 for v in values):
        return None
    for size in range(0, min(len(names), 6) + 1):
        for combo in itertools.combinations(names, size):
            prods = [math.prod(float(r[n]) for n in combo) for r in rows]
            ratios = [v / q for v, q in zip(values, prods)]
            c = ratios[0]
            if all(abs(r - c) <= 1e-9 * abs(c) for r in ratios):
                coeff = round(c)
                if abs(coeff - c) > 1e-9 * abs(c) or coeff <= 0:
                    continue
                terms = ([str(coeff)] if coeff != 1 or not combo else []) + list(combo)
                return " * ".join(terms)
    return None


def _roofline(stats: list[probe.MetaStats], rows: list[dict[str, Any]], names: list[str]) -> tuple[str, str, bool]:
    """(flops, bytes, per_shape): formulas fitted over the shapes, or per-shape numbers in params when none fits."""
    if len(rows) < 3:  # too few shapes to trust a fit
        return "roof_flops", "roof_bytes", True
    flops = _fit_monomial([s.flops for s in stats], rows, names)
    terms: list[str] = []
    for i in range(len(stats[0].numels)):
        numels = [float(s.numels[i]) if i < len(s.numels) else -1.0 for s in stats]
        term = _fit_monomial(numels, rows, names)
        if term is None:
            terms = []
            break
        size = stats[0].elem_sizes[i]
        terms.append(f"{size} * {term}" if term not in ("0", "1") else str(size * int(term)))
    if flops is None or not terms:
        return "roof_flops", "roof_bytes", True
    return flops, " + ".join(terms), False


def _fmt_params(params: dict[str, Any]) -> str:
    parts = []
    for k, v in params.items():
        if isinstance(v, bool):
            parts.append(f"{k} = {'true' if v else 'false'}")
        elif isinstance(v, float):
            parts.append(f"{k} = {v!r}")
        elif isinstance(v, int):
            parts.append(f"{k} = {v}")
        else:
            parts.append(f"{k} = {_toml_str(str(v))}")
    return "{ " + ", ".join(parts) + " }"


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def _round_up(value: float) -> float:
    """Round up to two significant digits, so task.toml holds 3.2e-06 rather than 3.1415e-06."""
    if value <= 0:
        return value
    exp = math.floor(math.log10(value)) - 1
    return float(f"{math.ceil(value / 10**exp) * 10**exp:.2g}")  # the float nearest the two-digit decimal


def build(spec: Spec, dest_root: Path, *, force: bool = False) -> Built:
    """Make the task folder dest_root/<spec.name> from a Spec.

    Raises:
        TaskError: the problem cannot become a task (one line naming the problem and the field); nothing is left
            at the destination.
    """
    started = time.monotonic()
    dest_root = Path(dest_root)
    dest = dest_root / spec.name
    if dest.exists() and not force:
        raise TaskError(f"{dest}: already exists (choose another name, or remove it first)")
    dest_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", dir=dest_root))
    try:
        built = _build_in(spec, staging / spec.name)
        if dest.exists():
            shutil.rmtree(dest)
        (staging / spec.name).rename(dest)
        built.folder = dest
        built.elapsed_s = time.monotonic() - started
        return built
    except probe.ProbeError as exc:
        raise TaskError(f"{spec.name}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write(folder: Path, spec: Spec, oracle: str, output_dtypes: list[str], compile_note: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "problem.py").write_text(spec.problem_source, encoding="utf-8")
    for name, text in spec.extra_files.items():
        (folder / name).write_text(text, encoding="utf-8")
    (folder / "reference.py").write_text(
        templates.reference_py(spec.name, spec.adapter, oracle, output_dtypes, spec.command), encoding="utf-8")
    (folder / "baseline.py").write_text(templates.baseline_py(spec.name, compile_note), encoding="utf-8")


def _build_in(spec: Spec, folder: Path) -> Built:
    if not spec.cuda:
        raise probe.ProbeError("shapes: no benchmark shape to build the task from")
    _write(folder, spec, "float64", [], "not checked yet.")
    p = _Probe(folder, spec.name)
    names = _scalable(spec)
    notes = list(spec.adapter.notes)

    # Benchmark shapes: costs from meta tensors, so any size is measured without memory.
    cuda_stats = [p.meta(params, f"shapes.cuda S{i + 1}") for i, params in enumerate(spec.cuda)]
    oracle_stats = []
    for i, params in enumerate(spec.cuda):
        try:
            oracle_stats.append(p.meta(params, f"shapes.cuda S{i + 1}", oracle=True))
        except probe.ProbeError:
            oracle_stats.append(None)
    limit = H200_MEMORY
    for i, (stats, ostats) in enumerate(zip(cuda_stats, oracle_stats)):
        need = probe.memory_bytes(stats, ostats)
        if need > limit:
            raise probe.ProbeError(f"shapes.cuda S{i + 1} {spec.cuda[i]}: needs about {probe.gib(need)} to "
                                   f"evaluate, more than the {probe.gib(limit)} of an H200")

    # CPU shapes: scaled down from the first benchmark shape; a second one with odd sizes.
    base = _scale_down(p, spec.cuda[0], names)
    if base is None:
        raise probe.ProbeError(f"shapes.cpu: no scaled-down version of S1 {spec.cuda[0]} fits the interpreter "
                               f"(at most {CPU_MAX_ELEMENTS} elements per tensor, {CPU_MAX_FLOPS:g} FLOPs) and runs")
    cpu = [base]
    odd = _perturb(p, base, names, _cpu_odd_step, lambda t: _valid_cpu(p, t, "a CPU shape") is not None)
    if odd is not None and odd != base:
        cpu.append(odd)

    def meta_ok(trial: dict[str, Any]) -> bool:
        try:
            p.meta(trial, "a held-out shape")
        except probe.ProbeError:
            return False
        return True

    heldout = [h for h in (_perturb(p, s, names, _heldout_step, meta_ok) for s in spec.cuda) if h is not None]
    heldout_cpu = [h for h in [_perturb(p, cpu[-1], names, _heldout_cpu_step,
                                        lambda t: _valid_cpu(p, t, "a held-out CPU shape") is not None)]
                   if h is not None and h not in cpu]
    if not heldout:
        notes.append("no held-out CUDA shape: no param could move to an odd size")

    groups = {"cuda": spec.cuda, "cpu": cpu, "heldout": heldout, "heldout_cpu": heldout_cpu}
    prefix = {"cuda": "S", "cpu": "C", "heldout": "H", "heldout_cpu": "HC"}

    # Calibration: the problem's own precision against the oracle, on real inputs, where this machine can afford it.
    calibrate = [("cpu", i, params) for i, params in enumerate(cpu)]
    calibrate += [("heldout_cpu", i, params) for i, params in enumerate(heldout_cpu)]
    skipped = []
    for i, (params, stats) in enumerate(zip(spec.cuda, cuda_stats)):
        if stats.flops <= CALIBRATE_MAX_FLOPS and probe.memory_bytes(stats, oracle_stats[i]) <= CALIBRATE_MAX_BYTES:
            calibrate.append(("cuda", i, params))
        else:
            skipped.append(f"S{i + 1}")
    oracle, errors, out_dtypes, p = _calibrate(p, folder, spec, calibrate, prefix)
    worst: dict[int, float] = {}
    for row in errors:
        for j, err in enumerate(row[2]):
            worst[j] = max(worst.get(j, 0.0), err)
            if not err <= MAX_OWN_ERROR:
                raise probe.ProbeError(
                    f"tolerance: the problem in its own precision is off by rel_rms {err:.3g} from the {oracle} oracle "
                    f"on {row[0]} seed {row[1]}: its output is mostly rounding (a near-constant or cancelling result?), "
                    f"so no tolerance can tell a right kernel from one returning a constant")

    # Determinism and input sanity, on the first CPU shape.
    _check_determinism(p, cpu[0])

    outputs = spec.adapter.constants.get("OUTPUT_NAMES") or []
    if len(outputs) != len(out_dtypes):
        outputs = _output_names(len(out_dtypes))
    tols = {}
    for j, name in enumerate(outputs):
        floor = FLOOR_EPS.get(out_dtypes[j], 1.0) * probe.eps_of(out_dtypes[j])
        tols[name] = _round_up(max(MARGIN * worst.get(j, 0.0), floor))

    # Roofline over every shape (meta costs), fitted as formulas where the shapes agree on one.
    all_rows: list[dict[str, Any]] = []
    all_stats: list[probe.MetaStats] = []
    for group, rows in groups.items():
        for i, params in enumerate(rows):
            all_rows.append(params)
            all_stats.append(cuda_stats[i] if group == "cuda" else p.meta(params, f"shapes.{group}"))
    if spec.output_axes is not None:
        for params, stats in zip(all_rows, all_stats):
            _check_output_axes(spec.output_axes, params, stats)
    flops_f, bytes_f, per_shape = _roofline(all_stats, all_rows, names)
    if per_shape:
        for params, stats in zip(all_rows, all_stats):
            params["roof_flops"] = stats.flops
            params["roof_bytes"] = stats.input_bytes + stats.output_bytes

    ops = set()
    for stats in all_stats:
        ops.update(probe.compute_ops(stats.ops))
    forbidden_ops = probe.forbidden_names(sorted(ops))

    compile_note = (_compile_check(p, cpu[0], tols, outputs) if spec.check_compile else
                    "not tried when the task was made; `workbench task check --compile` tries it")
    _write(folder, spec, oracle, out_dtypes, compile_note)
    (folder / "seed.py").write_text(templates.seed_py(spec.name, spec.adapter.args, outputs), encoding="utf-8")
    text = _task_toml(spec, outputs, tols, errors, skipped, oracle, flops_f, bytes_f, per_shape, sorted(ops),
                      forbidden_ops, groups, prefix, worst, out_dtypes)
    (folder / "task.toml").write_text(text, encoding="utf-8")

    from workbench.tasks.loader import load_task_dir

    load_task_dir(folder)  # the generated folder must load as strictly as a shipped one
    final = _Probe(folder, spec.name + "_final")
    for params in cpu:
        final.real(params, 0, "a CPU shape (generated files)")
    shown = {g: [{"name": f"{prefix[g]}{i + 1}", **r} for i, r in enumerate(rows)] for g, rows in groups.items()}
    table = [f"{row[0]:<4} seed {row[1]}  " + "  ".join(f"{o} {e:.3g}" for o, e in zip(outputs, row[2]))
             for row in errors]
    if skipped:
        notes.append(f"not calibrated on this machine (too large for its CPU): {', '.join(skipped)}; "
                     f"`workbench task check {spec.name}` on a GPU measures them")
    notes.append(f"torch.compile baseline: {compile_note}")
    return Built(folder=folder, shapes=shown, tolerance=tols, calibration=table, notes=notes)


def _check_output_axes(axes: list[list[str] | None], params: dict[str, Any], stats: probe.MetaStats) -> None:
    if len(axes) != len(stats.outputs):
        raise probe.ProbeError(f"outputs: the definition lists {len(axes)}, the reference returns {len(stats.outputs)}")
    for j, (names, (shape, _)) in enumerate(zip(axes, stats.outputs)):
        want = tuple(params[a] for a in names) if names is not None else ()
        if tuple(shape) != want:
            raise probe.ProbeError(f"outputs[{j}].shape: the reference returns {list(shape)} where the definition's "
                                   f"axes {names} give {list(want)} (at {params}); does it hard-code a size?")


def _output_names(n: int) -> list[str]:
    return ["out"] if n == 1 else [f"out{i}" for i in range(n)]


def _calibrate(p: _Probe, folder: Path, spec: Spec, calibrate: list[tuple[str, int, dict[str, Any]]],
               prefix: dict[str, str]) -> tuple[str, list[tuple[str, int, list[float]]], list[str], _Probe]:
    """Pick the widest oracle precision the problem runs in and measure its own precision's error against it.

    Returns:
        (oracle, rows, output dtypes, probe of the files as written): rows are (shape, seed, rel_rms per output).
    """
    last_error = None
    for oracle in templates.ORACLES:
        if oracle != "float64":
            _write(folder, spec, oracle, [], "not checked yet.")
            p = _Probe(folder, f"{spec.name}_{oracle}")
        rows: list[tuple[str, int, list[float]]] = []
        dtypes: list[str] = []
        try:
            for group, i, params in calibrate:
                what = f"shapes.{group} {prefix[group]}{i + 1}"
                for seed in SEEDS:
                    base, ref, _ = p.real(params, seed, f"{what} seed {seed}")
                    if len(base) != len(ref):
                        raise probe.ProbeError(f"the reference returns {len(ref)} outputs in {oracle} but "
                                               f"{len(base)} in the problem's precision ({what})")
                    for j, r in enumerate(ref):
                        _check_oracle_output(r, j, what)
                    dtypes = [str(b.dtype).removeprefix("torch.") for b in base]
                    rows.append((f"{prefix[group]}{i + 1}", seed,
                                 [probe.rel_rms(r, b) for r, b in zip(ref, base)]))
        except OracleError as exc:
            if oracle == "native":
                raise
            last_error = exc
            continue
        if last_error is not None:
            spec.adapter.notes.append(f"the problem does not run in a wider precision ({last_error}); the oracle "
                                      f"computes in {oracle}")
        return oracle, rows, dtypes, p
    raise probe.ProbeError(str(last_error))


def _check_oracle_output(t: Any, j: int, what: str) -> None:
    import torch

    if t.numel() == 0:
        raise probe.ProbeError(f"outputs[{j}]: the reference returns an empty tensor on {what}")
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        raise probe.ProbeError(f"outputs[{j}]: the reference returns NaN/inf on {what}")
    if float(torch.linalg.vector_norm(t.to(torch.float64))) == 0.0:
        raise probe.ProbeError(f"outputs[{j}]: the reference returns all zeros on {what}, so a kernel returning "
                               f"zeros would pass (make the inputs exercise it)")


def _check_determinism(p: _Probe, params: dict[str, Any]) -> None:
    """Same inputs twice give bit-identical reference outputs, and make_inputs repeats itself for a seed."""
    import torch

    from workbench.evaluator.inputs import fingerprint

    first = p.reference.make_inputs(dict(params), 0, "cpu")
    again = p.reference.make_inputs(dict(params), 0, "cpu")
    if fingerprint(first) != fingerprint(again):
        raise probe.ProbeError("make_inputs: two calls with the same seed give different inputs (the problem's "
                               "input code draws from a generator of its own?)")
    a = probe.real_outputs(p.reference.forward, first, "the reference", RUN_TIMEOUT_S)
    b = probe.real_outputs(p.reference.forward, again, "the reference", RUN_TIMEOUT_S)
    diff = probe.same(a, b)
    if diff > 0:
        raise probe.ProbeError(f"reference: not deterministic: two runs on the same inputs differ (rel_rms {diff:.3g}) "
                               f"on {params}; an oracle must give one answer (dropout, random ops, atomics?)")
    del torch


def _compile_check(p: _Probe, params: dict[str, Any], tols: dict[str, float], outputs: list[str]) -> str:
    """Whether torch.compile of the baseline works here and agrees with the oracle (one line for the files)."""
    try:
        inputs = p.reference.make_inputs(dict(params), 0, "cpu")
        ref = probe.real_outputs(p.reference.forward, inputs, "the reference", RUN_TIMEOUT_S)
        got = probe.real_outputs(p.baseline.compiled, inputs, "torch.compile", RUN_TIMEOUT_S)
    except probe.ProbeError as exc:
        return f"does not work here ({exc})"
    errs = [probe.rel_rms(r, g) for r, g in zip(ref, got)]
    bad = [o for o, e in zip(outputs, errs) if not e <= tols[o]]
    if bad:
        return f"compiles but is outside the tolerance on {', '.join(bad)} (rel_rms {max(errs):.3g})"
    return f"works on this machine (CPU shape {params}, rel_rms {max(errs, default=0.0):.3g})"


def _task_toml(spec: Spec, outputs: list[str], tols: dict[str, float], errors: list[tuple[str, int, list[float]]],
               skipped: list[str], oracle: str, flops: str, nbytes: str, per_shape: bool, ops: list[str],
               forbidden_ops: list[str], groups: dict[str, list[dict[str, Any]]], prefix: dict[str, str],
               worst: dict[int, float], out_dtypes: list[str]) -> str:
    value = max(tols.values())
    lines = [
        f"# Generated by `workbench {spec.command}` on {date.today().isoformat()}; edit freely.",
        f"name = {_toml_str(spec.name)}",
        f"description = {_toml_str(spec.description)}",
        'entry = "forward"',
        f"outputs = [{', '.join(_toml_str(o) for o in outputs)}]",
        "",
        "# Tolerance, calibrated: rel_rms of the problem in its own precision against the oracle "
        f"({'the problem in ' + oracle if oracle != 'native' else 'the problem itself: it cannot run wider'}),",
        f"# on real inputs (seeds {', '.join(map(str, SEEDS))}). tolerance = max({MARGIN:g} x worst, "
        f"{FLOOR_EPS.get(out_dtypes[0] if out_dtypes else '', 1.0):g} x eps of the output dtype).",
        "#   shape  seed  " + "  ".join(f"{o:>10}" for o in outputs),
    ]
    for shape, seed, errs in errors:
        lines.append(f"#   {shape:<6} {seed:<4}  " + "  ".join(f"{e:>10.3g}" for e in errs))
    lines.append("#   worst         " + "  ".join(f"{worst.get(j, 0.0):>10.3g}" for j in range(len(outputs))))
    lines.append("#   dtype         " + "  ".join(f"{d:>10}" for d in out_dtypes))
    if skipped:
        lines.append(f"#   not measured here (too large for this CPU): {', '.join(skipped)}; `workbench task check` "
                     "on a GPU measures them.")
    lines += ["[tolerance]", 'metric = "rel_rms"', f"value = {value!r}"]
    if len(outputs) > 1 and len(set(tols.values())) > 1:
        lines.append("[tolerance.per_output]")
        lines += [f"{o} = {t!r}" for o, t in tols.items()]
    lines += [
        "",
        "# Roofline: bytes = every input read once and every output written once; FLOPs from torch's FLOP counter,",
        "# which counts matmul, convolution and attention (pointwise work counts 0). Edit to what the kernel must do.",
    ]
    if per_shape:
        lines.append("# No formula fits every shape, so each shape carries its own roof_flops and roof_bytes.")
    lines += ["[roofline]", f"flops = {_toml_str(flops)}", f"bytes = {_toml_str(nbytes)}", ""]
    lines.append(f"# The compute ops the problem itself dispatches: {', '.join(ops) or 'none'}.")
    lines += ["[forbidden]", f"imports = [{', '.join(_toml_str(i) for i in FORBIDDEN_IMPORTS)}]",
              f"torch_ops = [{', '.join(_toml_str(o) for o in forbidden_ops)}]", ""]
    comments = {
        "cuda": "# Benchmark shapes (timed on CUDA).",
        "cpu": "# Triton-interpreter shapes: S1 scaled down, then with odd sizes.",
        "heldout": "# Held-out shapes (never shown to the agent): the benchmark shapes moved to odd sizes.",
        "heldout_cpu": "# Held-out interpreter shapes.",
    }
    for group, rows in groups.items():
        if not rows:
            continue
        lines.append(comments[group])
        for i, params in enumerate(rows):
            lines += [f"[[shapes.{group}]]", f'name = "{prefix[group]}{i + 1}"', f"params = {_fmt_params(params)}", ""]
    return "\n".join(lines).rstrip() + "\n"
