"""The evaluation pool a run gets: slot runners over the evaluator, one slot per GPU (or CPU slot) of this host.

The runtime only knows the pool contract (workbench.fleet.api). What fills the pool lives here: `EvaluatorRunner`
puts any Evaluator behind a slot (tests, scripts, `AgentRuntime(evaluator=...)`), `ServiceRunner` one
EvaluationService pinned to one GPU (or a CPU slot), and `host_pool` builds the slots of this host for `--workers`.
The fleet's own factory (`workbench.fleet.make_pool`: faults, retiring, Ray) replaces `host_pool` in the CLI.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from workbench.fleet.api import EvalJob, SlotInfo
from workbench.fleet.local import LocalPool

if TYPE_CHECKING:
    from workbench.agent.evaluation import Evaluator
    from workbench.evaluator.result import EvalResult
    from workbench.tasks import Task

RAY_EXTRA = "pip install -e '.[cluster]'"
"""What brings Ray (the optional extra `cluster`)."""

RAY_CONNECT_S = 5.0
"""How long a Ray address gets to accept a connection before the run is refused (ray.init itself waits minutes)."""


class PoolError(Exception):
    """The pool asked for cannot be made (more workers than GPUs, Ray missing or not answering): one line."""


class EvaluatorRunner:
    """A slot runner over an Evaluator (SlotRunner): the job's file of the task, with the held-out flag."""

    def __init__(self, evaluator: "Evaluator", task: "Task") -> None:
        self.evaluator = evaluator
        self.task = task

    def run(self, job: EvalJob) -> "EvalResult":
        """Evaluate the job's attempt file."""
        return self.evaluator.evaluate(self.task, job.path, heldout=job.heldout)

    def close(self) -> None:
        """Close the evaluator."""
        self.evaluator.close()


def evaluator_pool(evaluators: Sequence["Evaluator"], task: "Task", device: str = "cpu") -> LocalPool:
    """A pool of one slot per evaluator, named '<device>:<i>' (slot 0 is the reference)."""
    return LocalPool([(SlotInfo(f"{device}:{i}", device, gpu=str(i) if device == "cuda" else None),
                       EvaluatorRunner(evaluator, task)) for i, evaluator in enumerate(evaluators)])


class ServiceRunner:
    """A slot runner over one EvaluationService (one trusted process for the run) on one GPU or CPU slot.

    Args:
        task: the task.
        device: "cuda" or "cpu".
        gpu: the GPU it uses (what CUDA_VISIBLE_DEVICES names), None on the CPU.
    """

    def __init__(self, task: "Task", device: str, gpu: str | None) -> None:
        from workbench.evaluator import EvaluationService

        self.service = EvaluationService(task, device, gpu=gpu)
        self.phase: Callable[[str], None] = lambda text: None
        """Where the running evaluation's steps go (the pool's set_phase for this slot, once the pool exists)."""

    def run(self, job: EvalJob) -> "EvalResult":
        """One evaluation; each step the service announces becomes the slot's phase."""
        return self.service.evaluate(job.path, heldout=job.heldout, on_stage=self._stage)

    def _stage(self, stage: dict[str, Any]) -> None:
        self.phase(" ".join(str(stage[k]) for k in ("stage", "shape") if stage.get(k)))

    def close(self) -> None:
        """Stop the service and its waiting candidate process."""
        self.service.close()


def visible_gpus() -> list[tuple[str, str | None]]:
    """(index as CUDA_VISIBLE_DEVICES names it, model name) of each GPU this process may use; [] without a driver."""
    names: dict[str, str] = {}
    if shutil.which("nvidia-smi") is not None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10, check=False)
            if out.returncode == 0:
                rows = (line.split(",", 1) for line in out.stdout.splitlines() if "," in line)
                names = {index.strip(): name.strip() for index, name in rows}
        except (OSError, subprocess.TimeoutExpired):
            pass
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(names.items())
    chosen = [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    return [(g, names.get(g)) for g in chosen] if names else []


def check_workers(device: str, workers: int | None) -> list[tuple[str, str | None]] | list[None]:
    """The GPU (index, name) of each slot for `workers` (None: every visible GPU on CUDA, one slot on the CPU).

    Raises:
        PoolError: workers < 1, or more workers than visible GPUs on CUDA.
    """
    if workers is not None and workers < 1:
        raise PoolError(f"--workers must be at least 1, not {workers}")
    if device != "cuda":
        return [None] * (workers or 1)
    gpus = visible_gpus()
    if not gpus:
        raise PoolError("--device cuda: no GPU is visible to this process (nvidia-smi, CUDA_VISIBLE_DEVICES)")
    if workers is not None and workers > len(gpus):
        raise PoolError(f"--workers {workers}: only {len(gpus)} GPU{'s' if len(gpus) != 1 else ''} visible "
                        f"({', '.join(g for g, _ in gpus)}); one evaluation slot per GPU, so at most --workers "
                        f"{len(gpus)}")
    return gpus[:workers or len(gpus)]


def ray_address() -> str | None:
    """RAY_ADDRESS, or None when unset (Ray then starts a local cluster)."""
    return os.environ.get("RAY_ADDRESS") or None


def check_ray(address: str | None) -> None:
    """Refuse `--cluster ray` before a session is made when Ray is missing or its address does not answer.

    Raises:
        PoolError: Ray is not installed, or nothing accepts a connection at the address within RAY_CONNECT_S.
    """
    try:
        import ray  # noqa: F401 - only to learn whether it imports (the pool's slots use it)
    except ImportError as exc:
        raise PoolError(f"--cluster ray needs Ray, which is not installed ({exc}): {RAY_EXTRA}") from None
    if address is None or address in ("auto", "local"):
        return
    target = urlsplit(address if "://" in address else f"ray://{address}")
    if not target.hostname or not target.port:
        raise PoolError(f"RAY_ADDRESS={address!r} is not host:port (or ray://host:port)")
    try:
        with socket.create_connection((target.hostname, target.port), timeout=RAY_CONNECT_S):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__).lower()
        raise PoolError(f"RAY_ADDRESS={address}: no Ray cluster answers there ({reason} after "
                        f"{RAY_CONNECT_S:g} s); start one with `ray start --head`, or unset RAY_ADDRESS for a "
                        "local one") from None


def host_pool(task: "Task", device: str, workers: int | None) -> LocalPool:
    """The slots of this host: one EvaluationService per GPU on CUDA, `workers` CPU slots on the CPU.

    Raises:
        PoolError: see check_workers.
    """
    runners: list[tuple[SlotInfo, ServiceRunner]] = []
    try:
        for i, gpu in enumerate(check_workers(device, workers)):
            if gpu is None:
                info = SlotInfo(f"cpu:{i}", device)
            else:
                info = SlotInfo(f"cuda:{gpu[0]}", device, gpu=gpu[0], gpu_name=gpu[1])
            runners.append((info, ServiceRunner(task, device, info.gpu)))
    except BaseException:
        for _, runner in runners:
            runner.close()
        raise
    pool = LocalPool(runners)
    for info, runner in runners:
        runner.phase = lambda text, slot=info.slot: pool.set_phase(slot, text)
    return pool
