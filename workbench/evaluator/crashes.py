"""One-line descriptions of how an evaluation ended badly: which step, which signal, the candidate's last words."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

STEPS = {
    "startup": "starting the candidate process",
    "load": "importing the candidate",
    "forward": "running forward",
    "compile": "compiling a Triton kernel",
    "inputs": "drawing the timing inputs",
    "warmup": "warming up forward",
    "timing": "timing forward",
    "revalidate": "re-checking forward's output after timing",
    "profile": "profiling forward",
    "graph": "timing forward under a CUDA graph",
    "baseline": "warming up the baseline",
    "precompile": "compiling the baseline's autotuning configs",
    "oracle": "computing the oracle's outputs",
    "service": "starting the evaluation service",
    "idle": "waiting for the evaluation service",
}
"""What each announced step was doing, in words."""


def describe(stage: dict[str, Any]) -> str:
    """'running forward on shape S1, seed 0' from an announced step."""
    name = stage.get("stage", "startup")
    text = STEPS.get(name, name)
    if name == "compile" and stage.get("kernel"):
        text += f" ({stage['kernel']})"
    if stage.get("trusted") and stage.get("side") == "baseline":
        text += " (baseline side)"
    if "shape" in stage:
        text += f" on shape {stage['shape']}"
    if stage.get("seed") is not None:
        text += f", seed {stage['seed']}"
    return text


def signal_name(rc: int) -> str:
    """SIGSEGV for -11, and so on."""
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def log_tail(log: Path, private: str, display: str) -> tuple[str, int | None]:
    """The last meaningful line of a child's output, and the last candidate line a faulthandler dump names."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "", None
    found = re.findall(r'File "' + re.escape(private) + r'", line (\d+)', text)
    line = int(found[-1]) if found else None
    # A faulthandler dump (after a fatal signal) lists frames and extension modules: the line number is all we
    # want from it, and the signal itself is named from the exit status.
    text = text.split("Fatal Python error:")[0]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[-1].replace(private, display)[:300] if lines else ""), line


def worker_death(rc: int | None, stage: dict[str, Any], display: str, log: Path, private: str,
                 detail: str = "") -> str:
    """The message for a candidate process that died or broke the protocol while a step ran."""
    tail, line = log_tail(log, private, display)
    where = f"{display}:{line}" if line else display
    how = (f"was killed by {signal_name(rc)}" if rc is not None and rc < 0 else
           f"exited with status {rc}" if rc is not None else f"broke the protocol ({detail or 'no reply'})")
    message = f"{where}: candidate process {how} while {describe(stage)}"
    if tail:
        message += f"; last output: {tail}"
    return message
