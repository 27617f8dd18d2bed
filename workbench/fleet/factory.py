"""make_pool: the evaluation pool a run uses, from the device, the workers asked for and the cluster, and its
preflight (what the CLI checks before a session is made).

On this host: one EvaluationService per free visible GPU (CUDA_VISIBLE_DEVICES set per service to the GPU's UUID,
two timing CPUs of its own, the waiting candidate processes on CPUs no service times on), or CPU slots with a share
of the CPUs each. With `cluster="ray"`: one Ray actor per GPU of the cluster (workbench.fleet.cluster). Either way
the caller gets a LocalPool, whose threads only wait: the evaluations run in other processes.

Overlap on one GPU: one timed evaluation at a time per GPU (a slot is one service, and a service evaluates one
candidate at a time). What overlaps there is what the service itself already overlaps: the next candidate process
imports (torch, Triton, our modules) on the spare CPUs during the evaluation, and touches the GPU (its context,
Triton's first launch) only once the evaluation's timing is over. Loading, compiling or checking the next candidate
on the GPU during timing was measured to disturb it on the H200 (MLA M1's launch-bound baseline went from +-1.4% to
+-60%, 2026-12-01, RESULTS "Evaluation service"), so no second candidate runs on a GPU while one is timed.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from workbench.devices import DeviceError, resolve_device
from workbench.fleet.api import FleetError, SlotInfo
from workbench.fleet.local import LocalPool

if TYPE_CHECKING:
    from workbench.fleet.observe import KernelObserver
    from workbench.tasks import Task

Cluster = Literal["ray"]
CLUSTERS = ("ray",)


def default_workers(device: str) -> str:
    """What --workers means when not given (for help texts)."""
    return "every free visible GPU" if device == "cuda" else "1"


def preflight(device: str, *, workers: int | None = None, cluster: str | None = None) -> None:
    """Check what a pool needs before a session is made: the device, the workers (against this host's free GPUs
    or CPUs), Ray and its address.

    Raises:
        FleetError: one line (the CLI exits 2).
    """
    resolved = _check_request(device, workers, cluster)
    if cluster is not None:
        from workbench.fleet import cluster as ray_cluster

        ray_cluster.preflight()
    elif resolved == "cuda":
        _choose_gpus(workers)
    else:
        _check_cpu_workers(workers or 1)


def _check_request(device: str, workers: int | None, cluster: str | None) -> str:
    """The resolved device, once the workers asked for and the cluster name are valid (FleetError otherwise)."""
    resolved = _device(device)
    if workers is not None and (isinstance(workers, bool) or workers < 1):
        raise FleetError(f"--workers must be a positive number, got {workers!r}")
    if cluster is not None and cluster not in CLUSTERS:
        raise FleetError(f"unknown cluster {cluster!r} (use {', '.join(CLUSTERS)})")
    return resolved


def _device(device: str) -> str:
    try:
        return resolve_device(device)
    except DeviceError as exc:
        raise FleetError(str(exc)) from None


def make_pool(task: "Task", device: str, *, workers: int | None = None, cluster: str | None = None,
              service_options: Mapping[str, Any] | None = None, observer: "KernelObserver | None" = None) -> LocalPool:
    """The evaluation pool for a run of `task` on `device`.

    Args:
        task: the loaded task.
        device: "cuda", "cpu" or "auto".
        workers: slots to use; default every free visible GPU on CUDA (every GPU of the cluster with Ray), 1 on
            the CPU (one per Ray node).
        cluster: None (this host) or "ray" (RAY_ADDRESS, or a local Ray started for the run).
        service_options: keyword arguments for each slot's EvaluationService (seeds, precision, ...).
        observer: each slot's look at a passing held-out check's kernels from outside (workbench.fleet.observe);
            a module-level function, since Ray sends it to its actors.

    Raises:
        FleetError: more workers than free GPUs on CUDA, every GPU busy, Ray missing or not answering.
    """
    resolved = _check_request(device, workers, cluster)  # the slots' own checks follow: nvidia-smi runs once
    options = dict(service_options or {})
    if cluster == "ray":
        from workbench.fleet import cluster as ray_cluster

        slots, skipped = ray_cluster.ray_slots(task, resolved, workers=workers, service_options=options,
                                               observer=observer)
    elif resolved == "cuda":
        slots, skipped = _gpu_slots(task, workers, options, observer)
    else:
        slots, skipped = _cpu_slots(task, workers or 1, options, observer)
    pool = LocalPool(slots, skipped)  # type: ignore[arg-type]
    for info, runner in slots:
        runner.on_phase = functools.partial(pool.set_phase, info.slot)
    return pool


def _usable_cpus() -> list[int]:
    from workbench.evaluator.service import usable_cpus

    return usable_cpus()


def _choose_gpus(workers: int | None) -> tuple[list, list[tuple[SlotInfo, str]]]:
    """The free visible GPUs a pool of `workers` uses, and the busy ones as skipped slots.

    Raises:
        FleetError: no GPU visible, every one busy, or fewer free than `workers`.
    """
    from workbench.fleet import gpus

    found = gpus.discover()
    if not found:
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise FleetError("device cuda: no GPU is visible" + (f" (CUDA_VISIBLE_DEVICES={hidden!r})"
                                                              if hidden is not None else ""))
    free = [g for g in found if not g.busy]
    skipped = [(SlotInfo(f"cuda:{g.index}", "cuda", gpu=g.index, gpu_name=g.name), g.busy)
               for g in found if g.busy]
    if not free:
        raise FleetError(f"device cuda: every visible GPU is busy with another job ({skipped[0][1]})")
    if workers is not None and workers > len(free):
        note = f"; {len(skipped)} busy with another job" if skipped else ""
        raise FleetError(f"--workers {workers}: this host has {len(free)} free GPU"
                         f"{'s' if len(free) != 1 else ''} ({len(found)} visible{note})")
    return (free[:workers] if workers is not None else free), skipped


def _gpu_slots(task: "Task", workers: int | None, options: dict[str, Any],
               observer: "KernelObserver | None" = None) -> tuple[list, list]:
    from workbench.evaluator.service import EvaluationService
    from workbench.fleet import gpus
    from workbench.fleet.runner import ServiceRunner

    chosen, skipped = _choose_gpus(workers)
    plan = gpus.plan_cpus(len(chosen), _usable_cpus(), "cuda")
    slots = []
    try:
        for gpu, cpus in zip(chosen, plan.slots):
            info = SlotInfo(f"cuda:{gpu.index}", "cuda", gpu=gpu.index, gpu_name=gpu.name)
            make = functools.partial(EvaluationService, task, "cuda", gpu=gpu.uuid or gpu.index, cpus=cpus or None,
                                     spare_cpus=plan.spare, **options)
            slots.append((info, ServiceRunner(info, make, observer)))
    except BaseException:
        for _, runner in slots:
            runner.close()
        raise
    return slots, skipped


def _check_cpu_workers(workers: int) -> list[int]:
    """The CPUs this process may use, when there are enough for `workers` CPU slots (one each at least)."""
    allowed = _usable_cpus()
    if allowed and workers > len(allowed):
        raise FleetError(f"--workers {workers} on the CPU: this process may use {len(allowed)} CPUs, one per worker "
                         "at most")
    return allowed


def _cpu_slots(task: "Task", workers: int, options: dict[str, Any],
               observer: "KernelObserver | None" = None) -> tuple[list, list]:
    from workbench.evaluator.service import EvaluationService
    from workbench.fleet import gpus
    from workbench.fleet.runner import ServiceRunner

    allowed = _check_cpu_workers(workers)
    plan = gpus.plan_cpus(workers, allowed, "cpu")
    slots = []
    try:
        for i, cpus in enumerate(plan.slots):
            info = SlotInfo(f"cpu:{i}", "cpu")
            make = functools.partial(EvaluationService, task, "cpu", cpus=cpus or None,
                                     spare_cpus=cpus or None, **options)
            slots.append((info, ServiceRunner(info, make, observer)))
    except BaseException:
        for _, runner in slots:
            runner.close()
        raise
    return slots, []
