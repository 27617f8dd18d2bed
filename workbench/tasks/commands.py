"""The bodies of `workbench task ...` and `workbench export flashinfer-bench`; cli.py only parses and wires them.

Each returns an exit status and raises TaskError for a problem the person can fix (one line, the CLI prints it).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

from workbench.tasks.loader import find_task, search_path, user_tasks_dir, valid_task_name
from workbench.tasks.model import TaskError

EXIT_OK, EXIT_FAIL = 0, 1


def _dest(args: argparse.Namespace) -> Path:
    """Where new tasks go: the first --tasks-dir, else the first $WORKBENCH_TASKS entry, else ./tasks."""
    return Path(args.tasks_dir[0]).resolve() if args.tasks_dir else user_tasks_dir()


def _free_name(name: str) -> None:
    """Refuse a name that is not a task name or that a task on the search path already has (it would shadow)."""
    if not valid_task_name(name):
        raise TaskError(f"task name {name!r}: use letters, digits, '_', '-' and '.'")
    try:
        folder = find_task(name)
    except TaskError:
        return
    raise TaskError(f"task name {name!r}: {folder} already has a task of that name (choose another)")


def _print_built(built) -> None:  # noqa: ANN001 - scaffold.Built, imported lazily with torch
    print(f"wrote {built.folder} in {built.elapsed_s:.1f} s")
    for group, rows in built.shapes.items():
        if rows:
            print(f"  shapes.{group}: " + "; ".join(
                f"{r['name']} " + ", ".join(f"{k}={v}" for k, v in r.items() if k != "name" and not k.startswith("roof_"))
                for r in rows))
    print("  tolerance: " + ", ".join(f"{k} {v:.3g}" for k, v in built.tolerance.items())
          + f" (from {len(built.calibration)} calibration runs; the table is in task.toml)")
    for note in built.notes:
        print(f"  note: {note}")


def task_new(args: argparse.Namespace) -> int:
    """workbench task new NAME --from FILE:FUNCTION --inputs FILE:FUNCTION [--shape k=v,...] [--tasks-dir DIR]."""
    _free_name(args.name)
    from workbench.tasks.fromfunction import spec_from_function
    from workbench.tasks.scaffold import build

    command = "task new " + " ".join(shlex.quote(a) for a in sys.argv[3:]) if len(sys.argv) > 3 else "task new"
    spec = spec_from_function(args.name, args.source, args.inputs, args.shape or [], command.strip())
    spec.check_compile = not args.no_compile_check
    built = build(spec, _dest(args))
    _print_built(built)
    _hint(built.folder)
    return EXIT_OK


def _hint(folder: Path) -> None:
    on_path = any(folder.parent == p for p in search_path())
    flag = "" if on_path else f" --tasks-dir {folder.parent}"
    print(f"next: workbench task check {folder.name}{flag}; then write the kernel in {folder / 'seed.py'} or run "
          f"`workbench run {folder.name}{flag} --agent claude`")


def task_check(args: argparse.Namespace) -> int:
    """workbench task check NAME [--device cpu|cuda] [--compile]."""
    from workbench.devices import default_device
    from workbench.tasks.check import check_task
    from workbench.tasks.loader import load_task

    task = load_task(args.name)
    device = args.device or default_device()
    if args.save_choices and device != "cuda":
        raise TaskError("--save-choices records a GPU's autotuning choices: it needs --device cuda")
    if args.save_choices:
        _precompile(task)
    report = check_task(task, device, compile_column=args.compile)
    print(f"task {task.name} ({task.dir})")
    print("\n".join(report.lines()))
    if args.save_choices:  # the problems are the task's (a tolerance, a shape); the autotuning itself ran
        _save_choices(task.dir)
    return EXIT_OK if not report.problems else EXIT_FAIL


def _precompile(task) -> None:  # noqa: ANN001 - tasks.model.Task
    """Before recording on a machine that never ran the baseline: compile its configs for every GPU shape at once,
    as the evaluation service does (precompile.py), so the check's autotuning benchmarks instead of compiling."""
    from workbench.evaluator import precompile

    if task.baseline is None:
        return
    shapes = [s.params for group in ("cuda", "heldout") for s in task.shapes.get(group, [])]
    done = precompile.run({"reference": str(task.reference), "baseline": str(task.baseline),
                           "task_dir": str(task.dir)}, shapes,
                          announce=lambda n: print(f"compiling the baseline's autotuning configs for {len(shapes)} "
                                                   f"shapes in {n} processes", flush=True))
    failed = done["shapes"] - done["ok"]
    print(f"compiled in {done['s']:.1f} s" + (f" ({failed} processes failed; the check autotunes what they left)"
                                              if failed else ""), flush=True)


def _save_choices(folder: Path) -> None:
    """After a check on the GPU: the autotuners' choices (the baseline's, autotuned for real) into tuned/."""
    import torch

    from workbench.evaluator import tuned

    gpu = torch.cuda.get_device_name()
    table = tuned.record(gpu)
    if not table["choices"]:
        raise TaskError(f"{folder.name}: its baseline holds no autotuned Triton kernels, so there is nothing to save")
    path = tuned.path_for(folder, gpu)
    tuned.write(path, table)
    entries = sum(len(v) for v in table["choices"].values())
    print(f"saved {entries} autotuning choices of {len(table['choices'])} kernels for {gpu} to {path}")


def task_import_kernelbench(args: argparse.Namespace) -> int:
    """workbench task import kernelbench FILE... [--tasks-dir DIR] [--prefix P] [--check]: one task per problem file;
    a line for each file that cannot be converted, then a summary table."""
    import time

    from workbench.tasks.kernelbench import spec_from_file, task_name
    from workbench.tasks.scaffold import build

    dest = _dest(args)
    rows: list[tuple[str, str, str, float]] = []
    started = time.monotonic()
    for file in args.files:
        path = Path(file)
        name = task_name(path, args.prefix)
        t0 = time.monotonic()
        try:
            _free_name(name)
            built = build(spec_from_file(path, name, f"task import kernelbench {path.name}"), dest)
            status, detail = "ok", ", ".join(f"{k} {v:.2g}" for k, v in built.tolerance.items())
            if args.check:
                status, detail = _check_row(name, detail)
        except TaskError as exc:
            status, detail = "failed", str(exc)
            print(f"{path}: cannot convert: {exc}", file=sys.stderr)
        rows.append((path.name, name, status, time.monotonic() - t0) + (detail,))
    _print_table(rows, time.monotonic() - started, dest)
    return EXIT_OK if all(r[2] == "ok" for r in rows) else EXIT_FAIL


def _check_row(name: str, detail: str) -> tuple[str, str]:
    """Run `task check` on the CPU for a just-imported task: ("ok", tolerance) or ("check failed", first problem)."""
    from workbench.tasks.check import check_task
    from workbench.tasks.loader import load_task

    report = check_task(load_task(name), "cpu")
    if report.problems:
        print(f"{name}: task check: {report.problems[0]}", file=sys.stderr)
        return "check failed", report.problems[0]
    return "ok", detail


def _print_table(rows: list[tuple], elapsed: float, dest: Path) -> None:
    width = max([len(r[0]) for r in rows] + [4])
    print(f"{'file':<{width}}  {'task':<{width + 3}}  {'status':<12} {'s':>6}  tolerance / reason")
    for file, name, status, seconds, detail in rows:
        print(f"{file:<{width}}  {name:<{width + 3}}  {status:<12} {seconds:>6.1f}  {detail[:100]}")
    ok = sum(1 for r in rows if r[2] == "ok")
    print(f"{ok}/{len(rows)} converted ({100 * ok / max(1, len(rows)):.0f}%) into {dest} in {elapsed:.0f} s")


def task_import_flashinfer(args: argparse.Namespace) -> int:
    """workbench task import flashinfer-bench DEFINITION.json [--workloads FILE.jsonl] [--name NAME] [--tasks-dir]."""
    import json

    from workbench.tasks import flashinfer
    from workbench.tasks.scaffold import build

    path = Path(args.definition)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TaskError(f"{path}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise TaskError(f"{path}: not JSON ({exc})") from None
    flashinfer.check_definition(data)
    workloads = flashinfer.read_workloads(Path(args.workloads), data["name"]) if args.workloads else []
    name = args.name or flashinfer.task_name(data["name"])
    _free_name(name)
    spec = flashinfer.spec_from_definition(data, workloads, name, f"task import flashinfer-bench {path.name}",
                                           args.workloads or "")
    built = build(spec, _dest(args))
    _print_built(built)
    _hint(built.folder)
    return EXIT_OK


def export_flashinfer(args: argparse.Namespace) -> int:
    """workbench export flashinfer-bench SESSION [--out DIR]: the best attempt as a Solution, its evaluation as Traces,
    in FlashInfer-Bench's TraceSet layout (definitions/, solutions/, traces/)."""
    import json
    import os

    from workbench.session import SessionError, SessionStore
    from workbench.session.replay import load_state
    from workbench.tasks import flashinfer
    from workbench.tasks.loader import load_task, load_task_dir

    root = Path(args.sessions_dir or os.environ.get("WORKBENCH_SESSIONS") or "sessions")
    try:
        files = SessionStore(root).open(args.id, writer=False)
    except SessionError as exc:
        raise TaskError(str(exc)) from None
    try:
        state = load_state(files)
        best = state.best_attempt
        if best is None:
            raise TaskError(f"session {state.id}: no attempt evaluated ok yet, so there is no solution to export")
        task = load_task_dir(state.goal["task_dir"]) if state.goal.get("task_dir") else load_task(state.task)
        definition_path = task.dir / flashinfer.DEFINITION_FILE
        if not definition_path.is_file():
            raise TaskError(f"task {task.name}: no {flashinfer.DEFINITION_FILE} in {task.dir}: export needs the "
                            f"task's FlashInfer-Bench Definition (tasks imported from one have it, as do kda and "
                            f"mla_decode)")
        definition = flashinfer.check_definition(json.loads(definition_path.read_text(encoding="utf-8")))
        result_path = files.attempt_dir(best.n) / "result.json"
        result = json.loads(result_path.read_text(encoding="utf-8")) if result_path.is_file() else {
            "verdict": best.verdict, "message": best.message, "shapes": best.shapes, "device": state.device,
            "timing_comparable": best.timing_comparable}
    finally:
        files.close()
    solution_name = f"{definition['name']}_workbench_{state.id}_a{best.n}"
    author = f"workbench {state.agent}" + (f" ({state.model})" if state.model else "")
    solution = flashinfer.solution_record(definition, solution_name, author, best.source, best.note, state.device)
    shapes = {s.name: s.params for group in task.shapes.values() for s in group}
    traces = flashinfer.trace_records(definition, solution_name, result, shapes, flashinfer.now())
    flashinfer.check_solution(solution)
    for trace in traces:
        flashinfer.check_trace(trace)
    out = Path(args.out or f"flashinfer-bench-{state.id}")
    op = re.sub(r"\W+", "_", definition["op_type"])
    paths = {
        out / "definitions" / op / f"{definition['name']}.json": json.dumps(definition, indent=2) + "\n",
        out / "solutions" / op / definition["name"] / f"{solution_name}.json": json.dumps(solution, indent=2) + "\n",
        out / "traces" / op / f"{definition['name']}.jsonl": "".join(json.dumps(t) + "\n" for t in traces),
    }
    for path, text in paths.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    print(f"wrote {out}: solution {solution_name} (attempt {best.n}, {best.speedup:.3g}x) and {len(traces)} trace(s)")
    for path in paths:
        print(f"  {path}")
    return EXIT_OK
