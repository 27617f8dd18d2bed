"""The bodies of `workbench task ...` and `workbench export flashinfer-bench`; cli.py only parses and wires them.

Each returns an exit status and raises TaskError for a problem the person can fix (one line, the CLI prints it).
"""

from __future__ import annotations

import argparse
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
    report = check_task(task, device, compile_column=args.compile)
    print(f"task {task.name} ({task.dir})")
    print("\n".join(report.lines()))
    return EXIT_OK if not report.problems else EXIT_FAIL


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
