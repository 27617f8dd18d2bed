"""Optional compute-sanitizer pass over one shape of a candidate (HARNESS.md F3): out-of-bounds accesses and races.

Slow (the sanitizer instruments every access), so it is for new bests, not for every attempt. It runs the same
driver ncu does (workbench.profiler.drive) under ``compute-sanitizer --tool memcheck|racecheck|initcheck`` and
reads the tool's error summary.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from workbench.evaluator import isolation, tether

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
_SUMMARY = re.compile(r"ERROR SUMMARY:\s*([\d,]+)\s+error")
_HAZARDS = re.compile(r"RACECHECK SUMMARY:\s*([\d,]+)\s+hazard")


class SanitizerError(Exception):
    """compute-sanitizer is missing, refused the device, or printed no summary; one line a person can act on."""


def parse(output: str) -> dict[str, Any]:
    """Read a compute-sanitizer log: the error count and the first reported problems.

    Raises:
        SanitizerError: no error summary in the output (the tool did not run to completion).
    """
    match = _SUMMARY.search(output) or _HAZARDS.search(output)
    if match is None:
        if "Device not supported" in output or "error 999" in output:
            raise SanitizerError("compute-sanitizer cannot instrument this GPU here (Device not supported)")
        raise SanitizerError("compute-sanitizer printed no error summary (it did not run to completion)")
    count = int(match.group(1).replace(",", ""))
    problems = [ln.strip().lstrip("=").strip() for ln in output.splitlines()
                if ln.startswith("=========") and re.search(r"(Invalid|Race|Uninitialized|hazard|Barrier)", ln)]
    return {"errors": count, "problems": problems[:5]}


def run(task: str, file: str | Path, shape: str, *, tool: str = "memcheck", timeout_s: float = 600.0,
        exe: str | None = None) -> dict[str, Any]:
    """Run one shape of a candidate under compute-sanitizer.

    Returns:
        {"tool", "shape", "errors", "problems": [first lines], "exit_status", "command"}.

    Raises:
        SanitizerError: unknown tool, sanitizer missing, timeout, no summary, or a run that failed with no error
            found (its "0 errors" would say nothing of kernels that never ran).
    """
    if tool not in TOOLS:
        raise SanitizerError(f"unknown sanitizer tool {tool!r} (use {', '.join(TOOLS)})")
    binary = exe or shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None)
    if binary is None:
        raise SanitizerError("compute-sanitizer is not installed or not on PATH")
    cmd = [binary, "--tool", tool, "--error-exitcode", "0", sys.executable, "-m", "workbench.profiler.drive",
           "--task", task, "--file", str(Path(file).absolute()), "--shape", shape, "--calls", "1"]
    try:
        proc = subprocess.run(tether.command_argv(cmd), capture_output=True, text=True, timeout=timeout_s,
                              env=isolation.candidate_env("cuda"))
    except subprocess.TimeoutExpired:
        raise SanitizerError(f"compute-sanitizer did not finish within {timeout_s:g} s") from None
    except OSError as exc:
        raise SanitizerError(f"compute-sanitizer could not start: {exc}") from None
    found = parse(proc.stdout + proc.stderr)
    # --error-exitcode 0: the status is the driver's own, so non-zero means the candidate's run itself failed.
    if proc.returncode != 0 and found["errors"] == 0:
        last = next((ln.strip() for ln in reversed(proc.stderr.splitlines())
                     if ln.strip() and not ln.startswith("=========")), "no message")
        raise SanitizerError(f"the run under compute-sanitizer failed with exit status {proc.returncode} before "
                             f"anything could be checked: {last}")
    return {"tool": tool, "shape": shape, **found, "exit_status": proc.returncode, "command": " ".join(cmd)}
