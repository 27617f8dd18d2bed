"""Find task folders and load their task.toml strictly: any unknown, missing or mistyped key is a TaskError."""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from workbench.tasks import roofline
from workbench.tasks.model import SHAPE_GROUPS, Shape, Task, TaskError

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_METRICS = ("rel_rms",)
"""Tolerance metrics the evaluator implements: rms(ref - out) / rms(ref), pass if err <= value."""

_TOP_KEYS = {
    "name": True,
    "description": True,
    "entry": True,
    "outputs": True,
    "plausible_speedup": False,
    "graph_timing": False,
    "tolerance": True,
    "roofline": True,
    "forbidden": False,
    "shapes": True,
}
"""Top-level keys of task.toml, mapped to whether they are required."""

DEFAULT_PLAUSIBLE_SPEEDUP = 10.0
"""KernelBench's excessive-speedup threshold, used when a task does not set its own."""


def tasks_root() -> Path:
    """Where the shipped task folders live: $WORKBENCH_KERNELS, else the repository's kernels/, else ./kernels."""
    env = os.environ.get("WORKBENCH_KERNELS")
    if env:
        return Path(env).expanduser().resolve()  # absolute: evaluator processes run elsewhere
    repo_kernels = Path(__file__).resolve().parents[2] / "kernels"
    if repo_kernels.is_dir():
        return repo_kernels
    return Path.cwd() / "kernels"


TASKS_ENV = "WORKBENCH_TASKS"
"""A search path (os.pathsep-separated) of folders holding user task folders, searched after the shipped ones."""
DEFAULT_USER_DIR = "tasks"
"""./tasks under the current directory: searched last, and where `workbench task new` writes by default."""


def add_tasks_dirs(dirs: Sequence[Path | str]) -> None:
    """Put `--tasks-dir` folders in front of $WORKBENCH_TASKS for this process and every child it starts.

    Child processes (the profiler's, the sanitizer's) find a task by name, so the path travels in the environment.
    """
    entries = [str(Path(d).expanduser().resolve()) for d in dirs]
    old = [e for e in os.environ.get(TASKS_ENV, "").split(os.pathsep) if e]
    os.environ[TASKS_ENV] = os.pathsep.join(dict.fromkeys(entries + old))


def search_path() -> list[Path]:
    """Folders searched for tasks, in order: the shipped kernels/, then $WORKBENCH_TASKS (with any --tasks-dir in
    front), then ./tasks. A name found in an earlier folder shadows the same name in a later one."""
    found = [tasks_root()]
    for entry in os.environ.get(TASKS_ENV, "").split(os.pathsep):
        if entry:
            found.append(Path(entry).expanduser().resolve())
    found.append((Path.cwd() / DEFAULT_USER_DIR).resolve())
    return list(dict.fromkeys(found))


def user_tasks_dir() -> Path:
    """Where new user tasks go when no --tasks-dir is given: the first $WORKBENCH_TASKS entry, else ./tasks."""
    for entry in os.environ.get(TASKS_ENV, "").split(os.pathsep):
        if entry:
            return Path(entry).expanduser().resolve()
    return (Path.cwd() / DEFAULT_USER_DIR).resolve()


class _Checker:
    """Typed accessors over a parsed TOML table that raise TaskError naming the file and the dotted key."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, key: str, problem: str) -> TaskError:
        return TaskError(f"{self.path}: {key}: {problem}")

    def keys(self, table: dict[str, Any], spec: dict[str, bool], prefix: str) -> None:
        for key in table:
            if key not in spec:
                raise self.fail(f"{prefix}{key}", f"unknown key (allowed: {', '.join(spec)})")
        for key, required in spec.items():
            if required and key not in table:
                raise self.fail(f"{prefix}{key}", "missing required key")

    def string(self, value: Any, key: str, *, ident: bool = False) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"must be a non-empty string, got {_tname(value)}")
        if ident and not _IDENT_RE.match(value):
            raise self.fail(key, f"{value!r} is not a Python identifier")
        return value

    def number(self, value: Any, key: str, *, minimum: float = 0.0) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"must be a number, got {_tname(value)}")
        if not math.isfinite(value) or value <= minimum:
            raise self.fail(key, f"must be finite and > {minimum:g}, got {value!r}")
        return float(value)

    def table(self, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table, got {_tname(value)}")
        return value

    def strings(self, value: Any, key: str, *, ident: bool = False, nonempty: bool = False) -> list[str]:
        if not isinstance(value, list):
            raise self.fail(key, f"must be a list of strings, got {_tname(value)}")
        if nonempty and not value:
            raise self.fail(key, "must not be empty")
        out = [self.string(v, f"{key}[{i}]", ident=ident) for i, v in enumerate(value)]
        if len(set(out)) != len(out):
            raise self.fail(key, "has duplicate entries")
        return out


def _tname(value: Any) -> str:
    return {dict: "a table", list: "a list", str: "a string", bool: "a boolean"}.get(type(value), type(value).__name__)


def _load_shapes(c: _Checker, value: Any) -> dict[str, list[Shape]]:
    table = c.table(value, "shapes")
    c.keys(table, {"cuda": True, "cpu": True, "heldout": False, "heldout_cpu": False}, "shapes.")
    seen: dict[str, str] = {}
    shapes: dict[str, list[Shape]] = {}
    for group in SHAPE_GROUPS:
        entries = table.get(group, [])
        key = f"shapes.{group}"
        if not isinstance(entries, list):
            raise c.fail(key, f"must be an array of tables ([[{key}]]), got {_tname(entries)}")
        if group in ("cuda", "cpu") and not entries:
            raise c.fail(key, "must list at least one shape")
        parsed = []
        for i, entry in enumerate(entries):
            where = f"{key}[{i}]"
            entry = c.table(entry, where)
            c.keys(entry, {"name": True, "params": True}, f"{where}.")
            name = c.string(entry["name"], f"{where}.name")
            if not _NAME_RE.match(name):
                raise c.fail(f"{where}.name", f"{name!r} may use only letters, digits, '_', '-', '.'")
            if name in seen:
                raise c.fail(f"{where}.name", f"{name!r} is already used in shapes.{seen[name]}")
            seen[name] = group
            params = c.table(entry["params"], f"{where}.params")
            if not params:
                raise c.fail(f"{where}.params", "must not be empty")
            for pkey, pval in params.items():
                if not isinstance(pval, (int, float, str, bool)):
                    raise c.fail(f"{where}.params.{pkey}", f"must be a number, string or boolean, got {_tname(pval)}")
            parsed.append(Shape(name=name, params=dict(params)))
        shapes[group] = parsed
    return shapes


def _parse(path: Path, folder_name: str) -> Task:
    c = _Checker(path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise TaskError(f"{path}: cannot read: {exc.strerror}") from None
    c.keys(data, _TOP_KEYS, "")

    name = c.string(data["name"], "name")
    if name != folder_name:
        raise c.fail("name", f"{name!r} does not match the folder name {folder_name!r}")
    description = c.string(data["description"], "description")
    entry = c.string(data["entry"], "entry", ident=True)
    outputs = c.strings(data["outputs"], "outputs", ident=True, nonempty=True)
    plausible = c.number(data.get("plausible_speedup", DEFAULT_PLAUSIBLE_SPEEDUP), "plausible_speedup", minimum=1.0)
    graph_timing = data.get("graph_timing", False)
    if not isinstance(graph_timing, bool):
        raise c.fail("graph_timing", f"must be true or false, got {_tname(graph_timing)}")

    tol = c.table(data["tolerance"], "tolerance")
    c.keys(tol, {"metric": True, "value": True, "per_output": False}, "tolerance.")
    metric = c.string(tol["metric"], "tolerance.metric")
    if metric not in _METRICS:
        raise c.fail("tolerance.metric", f"{metric!r} is not one of {', '.join(_METRICS)}")
    value = c.number(tol["value"], "tolerance.value")
    per_output = {}
    for out, v in c.table(tol.get("per_output", {}), "tolerance.per_output").items():
        if out not in outputs:
            raise c.fail(f"tolerance.per_output.{out}", f"is not one of outputs ({', '.join(outputs)})")
        per_output[out] = c.number(v, f"tolerance.per_output.{out}")

    roof = c.table(data["roofline"], "roofline")
    c.keys(roof, {"flops": True, "bytes": True}, "roofline.")
    trees = {}
    for key in ("flops", "bytes"):
        c.string(roof[key], f"roofline.{key}")
        try:
            trees[key] = roofline.parse(roof[key])
        except roofline.ExpressionError as exc:
            raise c.fail(f"roofline.{key}", str(exc)) from None

    forbidden = c.table(data.get("forbidden", {}), "forbidden")
    c.keys(forbidden, {"imports": False, "torch_ops": False}, "forbidden.")
    imports = c.strings(forbidden.get("imports", []), "forbidden.imports")
    torch_ops = c.strings(forbidden.get("torch_ops", []), "forbidden.torch_ops")

    shapes = _load_shapes(c, data["shapes"])
    for group, group_shapes in shapes.items():
        for shape in group_shapes:
            scope = roofline.names(shape.params)
            for key, tree in trees.items():
                try:
                    roofline.evaluate(tree, scope)
                except roofline.ExpressionError as exc:
                    raise c.fail(f"roofline.{key}", f"{exc} (shape {shape.name} in shapes.{group})") from None

    folder = path.parent
    files = {}
    for stem in ("reference", "seed"):
        file = folder / f"{stem}.py"
        if not file.is_file():
            raise TaskError(f"{file}: missing (every task needs {stem}.py)")
        files[stem] = file
    baseline = folder / "baseline.py"
    return Task(
        name=name,
        description=description,
        entry=entry,
        outputs=outputs,
        tolerance={"metric": metric, "value": value, "per_output": per_output},
        roofline={"flops": roof["flops"], "bytes": roof["bytes"]},
        forbidden_imports=imports,
        forbidden_torch_ops=torch_ops,
        plausible_speedup=plausible,
        graph_timing=graph_timing,
        shapes=shapes,
        dir=folder,
        reference=files["reference"],
        seed=files["seed"],
        baseline=baseline if baseline.is_file() else None,
        _trees=trees,
    )


def valid_task_name(name: str) -> bool:
    """Whether `name` may name a task folder (letters, digits, '_', '-', '.'; not starting with '-' or '.')."""
    return isinstance(name, str) and bool(_NAME_RE.match(name))


def _check_name(name: str) -> None:
    if not valid_task_name(name):
        raise TaskError(f"unknown task {name!r}: not a valid task name")


def find_task(name: str) -> Path:
    """The folder of task `name`: the first folder on the search path that holds <name>/task.toml.

    Raises:
        TaskError: an invalid name, or no folder on the search path holds it (the message lists what was searched).
    """
    _check_name(name)
    roots = search_path()
    for root in roots:
        if (root / name / "task.toml").is_file():
            return root / name
    known = sorted({p.parent.name for root in roots if root.is_dir() for p in root.glob("*/task.toml")})
    where = ", ".join(str(r) for r in roots)
    raise TaskError(f"unknown task {name!r}: not in {where} (tasks: {', '.join(known) or 'none'}; "
                    f"add a folder with --tasks-dir or ${TASKS_ENV})")


def load_task(name: str, root: Path | str | None = None) -> Task:
    """Load and validate <folder>/<name>/task.toml.

    Args:
        name: the task's folder name.
        root: the one folder holding task folders; default: the search path (shipped kernels/, then user folders).

    Raises:
        TaskError: an unknown task, or a task.toml that fails validation (one line naming the file and key).
    """
    _check_name(name)
    if root is None:
        return _parse(find_task(name) / "task.toml", name)
    base = Path(root).resolve()
    path = base / name / "task.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.parent.name for p in base.glob("*/task.toml"))) or "none"
        raise TaskError(f"unknown task {name!r}: no {path} (tasks: {known})")
    return _parse(path, name)


def load_task_dir(folder: Path | str) -> Task:
    """Load the task in one folder (a session's journaled task folder), wherever it lives.

    Raises:
        TaskError: the folder has no task.toml, or it fails validation.
    """
    folder = Path(folder).resolve()
    path = folder / "task.toml"
    if not path.is_file():
        raise TaskError(f"{folder}: no task.toml there (was the task folder moved or deleted?)")
    return _parse(path, folder.name)


def list_tasks(root: Path | str | None = None) -> list[Task | TaskError]:
    """Every task folder under root (default: every folder on the search path, shadowed names left out), loaded;
    a folder that fails to load appears as its TaskError."""
    if root is None:
        return [entry.task for entry in discover() if entry.shadowed_by is None]
    base = Path(root)
    if not base.is_dir():
        return []
    found: list[Task | TaskError] = []
    for folder in sorted(p for p in base.iterdir() if (p / "task.toml").is_file()):
        try:
            found.append(_parse(folder / "task.toml", folder.name))
        except TaskError as exc:
            found.append(exc)
    return found


@dataclass(frozen=True)
class Found:
    """One task folder on the search path."""

    name: str
    folder: Path
    task: Task | TaskError
    shipped: bool
    """True for the shipped kernels/ folder, False for a user folder."""
    shadowed_by: Path | None = None
    """An earlier folder on the path with the same task name, which `load_task` picks instead."""


def discover() -> list[Found]:
    """Every task folder on the search path, in path order, each loaded (or its TaskError)."""
    roots = search_path()
    first: dict[str, Path] = {}
    found: list[Found] = []
    for index, root in enumerate(roots):
        if not root.is_dir():
            continue
        for folder in sorted(p for p in root.iterdir() if (p / "task.toml").is_file()):
            try:
                task: Task | TaskError = _parse(folder / "task.toml", folder.name)
            except TaskError as exc:
                task = exc
            found.append(Found(folder.name, folder, task, index == 0, first.get(folder.name)))
            first.setdefault(folder.name, folder)
    return found
