"""What is decided about a candidate before any process runs it: its bytes, hash, syntax and the static guards.

The bytes read here are the bytes run (copied into the candidate process's private folder), even if the file
changes while it is evaluated, and the sha256 in the result is theirs.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench import pyast
from workbench.evaluator.errors import EvalUsageError
from workbench.evaluator.guards import check_static
from workbench.evaluator.guards.static import jit_functions

if TYPE_CHECKING:
    from workbench.tasks import Task


@dataclass
class Submission:
    """One candidate file, read and checked statically."""

    path: Path
    data: bytes
    sha256: str
    jit_names: list[str] = field(default_factory=list)
    """Names of the @triton.jit functions it defines (the kernels its profile may show)."""
    early: dict[str, Any] | None = None
    """The whole result when the static checks already decide it (compile_error, forbidden)."""
    static_guards: bool = True
    started: float = field(default_factory=time.monotonic)


def base_result(task: "Task", sub: Submission, device: str, seeds: int) -> dict[str, Any]:
    """The result's keys before anything ran (the contract's, with a crash verdict until something says else)."""
    result: dict[str, Any] = {
        "task": task.name,
        "file": str(sub.path),
        "sha256": sub.sha256,
        "device": "cpu-interpret" if device == "cpu" else "cuda",
        "verdict": "crash",
        "message": "",
        "shapes": [],
        "speedup": None,
        "timing_comparable": device == "cuda",
        "baseline": None,
        "seeds": seeds,
    }
    if not sub.static_guards:
        result["static_guards"] = False
    return result


def submit(task: "Task", file: Path | str, device: str, seeds: int, *, static_guards: bool = True) -> Submission:
    """Read and statically check one candidate file.

    Args:
        static_guards: False skips the static source checks, so that the self-test can prove the run-time guards
            catch on their own what the static ones would have; every real evaluation keeps them.

    Raises:
        EvalUsageError: the file does not exist.
    """
    from workbench.evaluator import verdict as verdicts

    path = Path(file).absolute()
    if not path.is_file():
        raise EvalUsageError(f"candidate file not found: {file}")
    data = path.read_bytes()
    sub = Submission(path, data, hashlib.sha256(data).hexdigest(), static_guards=static_guards)

    def early(verdict: str, message: str, **extra: Any) -> Submission:
        result = base_result(task, sub, device, seeds)
        result.update(verdict=verdict, message=message, **extra)
        result["elapsed_s"] = round(time.monotonic() - sub.started, 3)
        sub.early = verdicts.clean(result)
        return sub

    try:
        source = data.decode("utf-8")
        tree = pyast.parse(source, filename=str(path))
    except UnicodeDecodeError as exc:
        return early("compile_error", f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})")
    except SyntaxError as exc:
        return early("compile_error", f"{path}:{exc.lineno}: SyntaxError: {exc.msg}")
    sub.jit_names = jit_functions(tree)
    findings = check_static(task, source, str(path), tree=tree) if static_guards else []
    if findings:
        first = findings[0]
        more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
        return early("forbidden", f"{path}:{first.line}: {first.message}{more}",
                     findings=[f.to_dict() for f in findings])
    return sub
