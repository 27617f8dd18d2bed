"""Jobs from files and draining a pool until they end, for the fleet tests that run real services."""

from __future__ import annotations

import time
from pathlib import Path

from workbench.fleet.api import EvalJob, JobFailed, JobFinished


def job(name: str, path: Path, **kw) -> EvalJob:
    """A job for a candidate file, its source read from the file."""
    return EvalJob(name, 1, path, path.read_text(), **kw)


def drain(pool, ends: int, timeout: float = 120.0) -> list:
    """Events until `ends` jobs have finished or failed; fails the test after `timeout` s (nothing can hang)."""
    out: list = []
    deadline = time.monotonic() + timeout
    while sum(isinstance(e, (JobFinished, JobFailed)) for e in out) < ends:
        assert time.monotonic() < deadline, f"timed out waiting; events so far: {out}"
        out += pool.events(0.5)
    return out
