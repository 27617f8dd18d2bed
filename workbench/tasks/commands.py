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
