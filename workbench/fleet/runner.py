"""ServiceRunner: a slot's runner, one EvaluationService on one GPU (or on the CPU), replaced when it fails.

It keeps the service's own distinction between the candidate and the trusted side exact: a candidate that crashes,
hangs or is wrong is a result; the trusted side failing is a SlotFault. The service already restarts its process
and re-runs an evaluation once when its trusted side fails; what reaches the runner is either a result after such a
recovery (the fault is reported, the result stands) or EvalServiceError after two failures (the service is
replaced by a new one on the same GPU and the job goes to another slot).
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.evaluator import scratch
from workbench.evaluator.errors import EvalAborted, EvalServiceError
from workbench.fleet.api import EvalJob, SlotInfo
from workbench.fleet.local import SlotFault
from workbench.fleet.observe import KernelObserver, observe
from workbench.stagelog import phase_of

if TYPE_CHECKING:
    from workbench.evaluator.result import EvalResult, MeasuredOn
    from workbench.evaluator.service import EvaluationService, Fault


def measured_on(info: SlotInfo) -> "MeasuredOn":
    """Where a result was measured, with the host named (a local SlotInfo leaves it '')."""
    return {"slot": info.slot, "device": info.device, "gpu": info.gpu, "gpu_name": info.gpu_name,
            "host": info.host or socket.gethostname()}


def describe_faults(faults: list["Fault"]) -> str:
    """The trusted side's faults during one job, one line."""
    return "; ".join(f"{f.kind}: {f.message}" for f in faults)[:500]


class ServiceRunner:
    """Evaluates a slot's jobs with one EvaluationService, made (and made again) by `make`.

    Args:
        info: the slot.
        make: builds the slot's service (the same GPU, CPUs and options each time).
        observer: lists a passing held-out check's kernels from outside (a job with observe), on the service's GPU.
    """

    def __init__(self, info: SlotInfo, make: Callable[[], "EvaluationService"],
                 observer: KernelObserver | None = None) -> None:
        self.info = info
        self._make = make
        self.observer = observer
        self.service: EvaluationService | None = make()
        """The current service; None once closed or when a replacement could not be made."""
        self.on_phase: Callable[[str], None] | None = None
        """Told each step of the evaluation in flight (the pool's set_phase for this slot); must not block."""
        self.replaced = 0
        """Services made again after one failed twice on a job."""
        self._scratch: Path | None = None
        """Where jobs whose file is not on this host are written from their source (made on first need)."""

    def _stage(self, stage: dict[str, Any]) -> None:
        if self.on_phase is not None:
            self.on_phase(phase_of(stage))

    def _path(self, job: EvalJob) -> Path:
        """The candidate's file: the job's own where it holds the job's source here, else that source written to a
        private folder (a slot on another host, or a file changed since the job was made): what is evaluated is
        always the job's source."""
        try:
            if job.path.read_text(encoding="utf-8") == job.source:
                return job.path
        except (OSError, UnicodeDecodeError):
            pass
        if self._scratch is None:
            self._scratch = scratch.make("slot")
        folder = self._scratch / job.id
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / job.path.name
        path.write_text(job.source, encoding="utf-8")
        return path

    def run(self, job: EvalJob) -> "EvalResult":
        """Evaluate one job on this slot's service.

        Raises:
            SlotFault: the trusted side failed (with the result when the service recovered and re-ran the job).
            EvalAborted: abort() stopped it.
            EvalUsageError: the job cannot be evaluated (a missing file, a task the service refuses).
        """
        service = self.service
        if service is None:
            raise SlotFault(f"{self.info.slot} has no evaluation service", retire=True)
        seen = len(service.health().faults)
        path = self._path(job)
        try:
            result = service.evaluate(path, heldout=job.heldout, on_stage=self._stage)
        except EvalAborted:
            raise
        except EvalServiceError as exc:
            raise self._replace(f"{self.info.slot}: {exc}") from None
        result["measured_on"] = measured_on(self.info)
        if job.observe:
            self._stage({"stage": "observe"})
            observe(self.observer, service.task, path, service.gpu, result)
        faults = service.health().faults[seen:]
        if faults:
            raise SlotFault(f"{self.info.slot}: {describe_faults(faults)}", result=result)
        return result

    def _replace(self, message: str) -> SlotFault:
        """A new service in place of one that failed twice on a job; retire when none can be made."""
        old, self.service = self.service, None
        if old is not None:
            old.close()
        try:
            self.service = self._make()
        except Exception as exc:  # noqa: BLE001 - no processes, a refused device: the slot cannot go on
            return SlotFault(f"{message}; no new service: {type(exc).__name__}: {exc}", retire=True)
        self.replaced += 1
        return SlotFault(message)

    def abort(self) -> None:
        """Stop the evaluation in flight (its candidate and service processes are killed)."""
        if self.service is not None:
            self.service.abort()

    def close(self) -> None:
        """Stop the service and its processes (aborting an evaluation in flight)."""
        service, self.service = self.service, None
        if service is not None:
            service.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
