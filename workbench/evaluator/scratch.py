"""Private scratch folders of the evaluator's processes, and the sweep that removes those a killed owner left.

Every evaluation, service, template, slot and Ray actor works in a folder of its own under the temporary directory
(the tensor slabs under /dev/shm), removed when its owner closes it. An owner killed with SIGKILL (a person's
`kill -9`, the OOM killer, a lost node) cannot remove anything, and over a day-long search those folders add up; the
slabs in /dev/shm are memory. So each folder names its owner (pid and the process's start time, against pid reuse)
in a file, and the next evaluation service on the machine removes the folders whose owner is gone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "workbench-"
OWNER = ".owner"
"""The file in a scratch folder that names its owner: "PID START" (START from /proc/PID/stat, clock ticks)."""


def _start_time(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def make(kind: str, root: str | Path | None = None) -> Path:
    """A new private folder workbench-KIND-XXXXXXXX under root (default: the temporary directory), owned by this
    process."""
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-", dir=root))
    start = _start_time(os.getpid())
    if start is not None:
        (path / OWNER).write_text(f"{os.getpid()} {start}\n")
    return path


def _orphaned(folder: Path) -> bool:
    """Whether a scratch folder's owner is gone (a folder without an owner file is left alone)."""
    try:
        pid, start = (folder / OWNER).read_text().split()
    except (OSError, ValueError):
        return False
    return _start_time(int(pid)) != start


def sweep(roots: tuple[str | Path, ...] | None = None) -> int:
    """Remove the scratch folders whose owner has died; returns how many. Cheap (one listing per root)."""
    removed = 0
    for root in roots or (tempfile.gettempdir(), "/dev/shm"):
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False) and _orphaned(Path(entry.path)):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
    return removed


_swept = False


def sweep_once() -> int:
    """sweep(), the first time a process asks (the first evaluation service it starts); 0 after that."""
    global _swept
    if _swept:
        return 0
    _swept = True
    return sweep()
