"""Find task folders and load their task.toml strictly: any unknown, missing or mistyped key is a TaskError."""

from __future__ import annotations

import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any

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
    """Where task folders live: $WORKBENCH_KERNELS, else the repository's kernels/, else ./kernels."""
    env = os.environ.get("WORKBENCH_KERNELS")
    if env:
        return Path(env).expanduser().resolve()  # absolute: evaluator processes run elsewhere
    repo_kernels = Path(__file__).resolve().parents[2] / "kernels"
    if repo_kernels.is_dir():
        return repo_kernels
    return Path.cwd() / "kernels"


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


def load_task(name: str, root: Path | str | None = None) -> Task:
    """Load and validate kernels/<name>/task.toml.

    Args:
        name: the task's folder name.
        root: the folder holding task folders; default `tasks_root()`.

    Raises:
        TaskError: an unknown task, or a task.toml that fails validation (one line naming the file and key).
    """
    base = Path(root).resolve() if root is not None else tasks_root()
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise TaskError(f"unknown task {name!r}: not a valid task name")
    path = base / name / "task.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.parent.name for p in base.glob("*/task.toml"))) or "none"
        raise TaskError(f"unknown task {name!r}: no {path} (tasks: {known})")
    return _parse(path, name)


def list_tasks(root: Path | str | None = None) -> list[Task | TaskError]:
    """Every task folder under root, loaded; a folder that fails to load appears as its TaskError."""
    base = Path(root) if root is not None else tasks_root()
    if not base.is_dir():
        return []
    found: list[Task | TaskError] = []
    for folder in sorted(p for p in base.iterdir() if (p / "task.toml").is_file()):
        try:
            found.append(_parse(folder / "task.toml", folder.name))
        except TaskError as exc:
            found.append(exc)
    return found
