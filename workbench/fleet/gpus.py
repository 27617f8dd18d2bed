"""This host's GPUs as the pool sees them, without importing torch: nvidia-smi's list, which ones are visible to
us, which are busy with someone else's job, and how the host's CPUs are shared between evaluation slots.

A GPU is busy when a compute process that is not ours runs on it, or when memory is in use on it that no process of
ours accounts for (inside a container nvidia-smi often cannot list another container's processes, but their memory
still shows).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from workbench.fleet.api import FleetError

BUSY_MIB = 1024
"""Memory in use on a GPU, beyond our own processes', above which someone else is using it (an idle H200 shows a
few MiB)."""
SMI_TIMEOUT_S = 15.0

Runner = Callable[[Sequence[str]], str]
"""Runs an nvidia-smi query (argv without the program) and returns its standard output."""


@dataclass(frozen=True)
class Gpu:
    """One GPU of this host."""

    index: str
    """nvidia-smi's index (PCI order)."""
    uuid: str
    """What the slot's service sets CUDA_VISIBLE_DEVICES to: exact whatever CUDA's own device order is."""
    name: str
    memory_used_mib: int
    busy: str = ""
    """Why someone else's job holds it ('' when it is free)."""


def _smi(args: Sequence[str]) -> str:
    if shutil.which("nvidia-smi") is None:
        raise FleetError("device cuda: nvidia-smi is not on PATH, so no GPU can be listed (use --device cpu)")
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FleetError(f"device cuda: nvidia-smi failed ({exc})") from None
    if out.returncode != 0:
        first = (out.stderr or out.stdout).strip().splitlines()
        raise FleetError(f"device cuda: nvidia-smi failed: {first[0] if first else f'exit {out.returncode}'}")
    return out.stdout


def _rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]


def _mib(text: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        return 0  # "[N/A]" where the driver does not say


def parse_gpus(text: str) -> list[tuple[str, str, str, int]]:
    """(index, uuid, name, memory used MiB) per row of `--query-gpu=index,uuid,name,memory.used`."""
    return [(r[0], r[1], ", ".join(r[2:-1]), _mib(r[-1])) for r in _rows(text) if len(r) >= 4]


def parse_apps(text: str) -> list[tuple[str, int, int]]:
    """(GPU uuid, pid, used MiB) per row of `--query-compute-apps=gpu_uuid,pid,used_memory`."""
    out = []
    for row in _rows(text):
        if len(row) >= 3 and row[1].isdigit():
            out.append((row[0], int(row[1]), _mib(row[2])))
    return out


def visible(gpus: list[Gpu], spec: str | None) -> list[Gpu]:
    """The GPUs CUDA_VISIBLE_DEVICES lets this process use, in its order (None: all of them).

    Entries are indices or UUIDs (CUDA takes a unique UUID prefix too); as in CUDA, an entry that names no GPU
    ends the list.
    """
    if spec is None:
        return list(gpus)
    chosen: list[Gpu] = []
    for entry in (e.strip() for e in spec.split(",")):
        match = [g for g in gpus if g.index == entry] if entry.isdigit() else \
            [g for g in gpus if entry.startswith(("GPU-", "MIG-")) and g.uuid.startswith(entry)]
        if len(match) != 1 or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen


def own_pids(root: int | None = None, proc: Path = Path("/proc")) -> set[int]:
    """This process and its descendants (from /proc; only the root where /proc cannot be read)."""
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    try:
        entries = list(proc.iterdir())
    except OSError:
        return {root}
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[1].isdigit():
            parents[int(entry.name)] = int(fields[1])
    ours = {root}
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in ours and pid not in ours:
                ours.add(pid)
                changed = True
    return ours


def busy_reason(gpu: tuple[str, str, str, int], apps: list[tuple[str, int, int]], ours: set[int],
                busy_mib: int = BUSY_MIB) -> str:
    """Why a GPU counts as busy with someone else's job ('' when free)."""
    index, uuid, _, used = gpu
    mine = [a for a in apps if a[0] == uuid]
    others = [a for a in mine if a[1] not in ours]
    if others:
        listed = ", ".join(f"pid {pid} ({mib} MiB)" for _, pid, mib in others[:3])
        return f"GPU {index} is busy with another job: {listed}"
    unaccounted = used - sum(mib for _, pid, mib in mine if pid in ours)
    if unaccounted >= busy_mib:
        return (f"GPU {index} is busy with another job: {unaccounted} MiB of its memory in use by processes this "
                "host does not list (another container?)")
    return ""


def discover(run: Runner | None = None, env: dict[str, str] | None = None,
             ours: set[int] | None = None) -> list[Gpu]:
    """The GPUs this process may use, with their busy state (run: nvidia-smi; env: os.environ; ours: own_pids()).

    Raises:
        FleetError: nvidia-smi is missing or fails.
    """
    run = _smi if run is None else run
    env = dict(os.environ) if env is None else env
    rows = parse_gpus(run(["--query-gpu=index,uuid,name,memory.used", "--format=csv,noheader,nounits"]))
    apps = parse_apps(run(["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"]))
    ours = own_pids() if ours is None else ours
    gpus = [Gpu(index, uuid, name, used, busy_reason((index, uuid, name, used), apps, ours))
            for index, uuid, name, used in rows]
    return visible(gpus, env.get("CUDA_VISIBLE_DEVICES"))


@dataclass(frozen=True)
class CpuPlan:
    """How a host's CPUs are shared between its evaluation slots."""

    slots: list[list[int]]
    """Each slot's own CPUs (a GPU slot: the two it times on, service and candidate)."""
    spare: list[int] | None
    """Where waiting candidate processes import, apart from every slot's timing CPUs (None: no CPU is left
    over, each service picks its own)."""


def plan_cpus(slots: int, allowed: Sequence[int], device: str) -> CpuPlan:
    """Give each slot CPUs of its own.

    On CUDA each slot gets two CPUs to time on while at least one CPU is left over for the waiting candidate
    processes (one each otherwise, then shared pairs). On the CPU each slot gets an equal share of the CPUs: that is
    where its evaluations run.
    """
    cpus = sorted(allowed)
    if not cpus or slots < 1:
        return CpuPlan([[] for _ in range(max(slots, 0))], None)
    if device != "cuda":
        share = max(1, len(cpus) // slots)
        return CpuPlan([cpus[(i * share) % len(cpus):][:share] or cpus[:share] for i in range(slots)], None)
    for per in (2, 1):
        if len(cpus) >= per * slots + 1:
            mine = [cpus[per * i:per * (i + 1)] for i in range(slots)]
            return CpuPlan(mine, cpus[per * slots:])
    return CpuPlan([[cpus[(2 * i) % len(cpus)], cpus[(2 * i + 1) % len(cpus)]] for i in range(slots)], None)
