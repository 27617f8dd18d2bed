"""The hash of a task's oracle: the files that decide what is correct and what a speedup is measured against.

Hashed: task.toml (shapes, tolerance, forbidden lists, roofline), reference.py (make_inputs and the oracle),
baseline.py (the speedup's denominator) and every module of the task folder that those import, transitively (a
generated task's problem.py, a reference's helpers). Not hashed: seed.py and the folder's other kernels, which are
starting points and candidates, not the oracle: editing them must not invalidate a session.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import TypedDict

from workbench import pyast

ORACLE_FILES = ("task.toml", "reference.py", "baseline.py")
"""The files that define the oracle, when present (baseline.py is optional)."""
HASH_VERSION = 1
"""Bumped when the set of hashed files or the way they are combined changes."""


class TaskHash(TypedDict):
    """What session.created journals about its task: the combined digest and one digest per file."""

    version: int
    sha256: str
    files: dict[str, str]
    """Folder-relative file name -> sha256 of its bytes."""


def _sibling_imports(path: Path) -> set[str]:
    """Modules of the same folder that a Python file imports (`import x`, `from x import y`, importlib by name)."""
    try:
        tree = pyast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(".py"):
            names.add(node.value[:-3])  # a file the module loads by path, e.g. Path(__file__).with_name("problem.py")
    return {n for n in names if (path.parent / f"{n}.py").is_file()}


def oracle_files(folder: Path | str) -> list[Path]:
    """The files of a task folder that the hash covers, sorted by name."""
    folder = Path(folder)
    todo = [folder / name for name in ORACLE_FILES if (folder / name).is_file()]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if path.suffix == ".py":
            todo.extend(folder / f"{name}.py" for name in _sibling_imports(path) if name != "seed")
    return sorted(seen, key=lambda p: p.name)


def task_hash(folder: Path | str) -> TaskHash:
    """Hash the oracle files of a task folder (see the module docstring for which and why)."""
    folder = Path(folder)
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in oracle_files(folder)}
    combined = hashlib.sha256("".join(f"{name}\0{digest}\n" for name, digest in sorted(files.items())).encode())
    return {"version": HASH_VERSION, "sha256": combined.hexdigest(), "files": files}


def changed_files(old: TaskHash, new: TaskHash) -> list[str]:
    """Names of the files that differ between two hashes: changed, added or removed (sorted)."""
    names = set(old.get("files", {})) | set(new.get("files", {}))
    return sorted(n for n in names if old.get("files", {}).get(n) != new.get("files", {}).get(n))
