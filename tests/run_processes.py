"""What the signal and orphan tests share: a kernel whose evaluation never ends, and the processes of one run.

Every process a run starts carries the run's TMPDIR (the trusted side gets the parent's environment less credentials,
candidate processes an allowlist that keeps TMPDIR), so /proc tells which processes belong to the run.
"""

from __future__ import annotations

from pathlib import Path

TINY_SEED = Path(__file__).resolve().parent / "fixtures" / "tasks" / "tiny" / "seed.py"


def slow_kernel(path: Path) -> Path:
    """The tiny task's seed with a forward that never returns: its evaluation lasts until its time limit."""
    seed = TINY_SEED.read_text(encoding="utf-8")
    path.write_text(seed.replace("def forward(x: torch.Tensor) -> torch.Tensor:\n",
                                 "def forward(x: torch.Tensor) -> torch.Tensor:\n    while True:\n        pass\n"),
                    encoding="utf-8")
    return path


def run_processes(tmpdir: Path) -> list[int]:
    """Live processes whose environment carries TMPDIR=tmpdir (a run and every process it started)."""
    mark = f"TMPDIR={tmpdir}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0") and \
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def candidate_started(tmpdir: Path) -> bool:
    """Whether a candidate process of the run has been handed its kernel (its private copy exists)."""
    return bool(list(tmpdir.glob("workbench-eval-*/candidate/kernel.py")))
