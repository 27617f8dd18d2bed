"""The evaluation pool's contract: jobs in, events out, drained by the one thread that writes the journal.

A pool runs evaluations on slots (one per GPU of this host, a CPU slot, or a Ray actor per GPU of another host).
The runtime submits `EvalJob`s and drains `PoolEvent`s from its own thread, so the journal keeps one writer however
many evaluations run at once: a slot never journals, it only reports. Jobs carry the candidate's source as well as
its path, so a slot on another host needs nothing but the job.

Every job ends in exactly one JobFinished or JobFailed. Between its JobStarted and that end there may be one
JobRequeued: the slot's trusted side failed on it (not the candidate), the slot was marked faulted or retired, and
the job waits for another slot, where it starts again (a second JobStarted, same job and attempt).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, Union

if TYPE_CHECKING:
    from workbench.evaluator.result import EvalResult

JobKind = Literal["heldout", "profile", "candidate"]
"""What a job is for; it sets the job's priority."""

PRIORITY: dict[str, int] = {"heldout": 0, "profile": 1, "candidate": 2}
"""Lower runs first: the held-out check of a new best, then profiles, then new candidates (FIFO within a kind)."""

SlotState = Literal["idle", "busy", "faulted", "retired", "skipped"]
"""faulted: its trusted side failed once and was replaced (it still takes jobs); retired: it failed again, or its
Ray actor was lost (it takes no more); skipped: never used (a GPU busy with someone else's job)."""

RETIRE_AFTER = 2
"""Faults of a slot's trusted side after which it is retired."""


class FleetError(Exception):
    """A pool that cannot be made (more workers than free GPUs, every GPU busy, Ray missing or not answering):
    one line, which the CLI prints before exiting with status 2."""



@dataclass(frozen=True)
class SlotInfo:
    """Where an evaluation runs: every result names its slot, device, GPU and host."""

    slot: str
    """A stable name, e.g. "cuda:0", "cpu:1", "ray:host-b:cuda:3"."""
    device: str
    """"cuda" or "cpu"."""
    gpu: str | None = None
    """The GPU index on its host (what CUDA_VISIBLE_DEVICES names), None for a CPU slot."""
    host: str = ""
    """The host name ('' for this host)."""
    gpu_name: str | None = None
    """The GPU's model name when known ("NVIDIA H200"): speedups are only compared between like GPUs."""

    def to_dict(self) -> dict[str, str | None]:
        """Plain data for the journal (eval.started / eval.finished)."""
        return {"slot": self.slot, "device": self.device, "gpu": self.gpu, "host": self.host,
                "gpu_name": self.gpu_name}


@dataclass(frozen=True)
class EvalJob:
    """One evaluation to run: an attempt's file (and its text, for slots on other hosts)."""

    id: str
    """Unique within a run; the journal's eval.started carries it, so a resume can tell which ones were in flight."""
    attempt: int
    path: Path
    source: str
    heldout: bool = False
    kind: JobKind = "candidate"
    slot: str | None = None
    """Run only on this slot (the reference GPU that confirms a new best); None: any slot of the right device."""
    observe: bool = False
    """With heldout: if the check passes, the slot also lists the candidate's kernels from outside its process (its
    runner's observer, on its GPU, before its next job; workbench.fleet.observe) into result["observed"]."""

    @property
    def priority(self) -> int:
        """PRIORITY of the job's kind."""
        return PRIORITY[self.kind]


@dataclass(frozen=True)
class JobStarted:
    """A slot took the job."""

    job: EvalJob
    slot: SlotInfo


@dataclass(frozen=True)
class JobFinished:
    """The job's result (any verdict: a crash or a timeout of the candidate is a result, not a failure)."""

    job: EvalJob
    slot: SlotInfo
    result: "EvalResult"


@dataclass(frozen=True)
class JobFailed:
    """The job could not be evaluated (the trusted side failed on it twice, or it was cancelled)."""

    job: EvalJob
    slot: SlotInfo | None
    message: str
    cancelled: bool = False


@dataclass(frozen=True)
class JobRequeued:
    """The slot's trusted side failed on the job (a fault of the GPU, the service or a lost Ray actor): it is queued
    again, once, for another slot where there is one; its earlier JobStarted has no end of its own."""

    job: EvalJob
    slot: SlotInfo
    """The slot it left."""
    message: str


@dataclass(frozen=True)
class SlotChanged:
    """A slot's state changed: faulted (and replaced), retired, skipped (a GPU busy with someone else's job)."""

    slot: SlotInfo
    state: SlotState
    message: str = ""


PoolEvent = Union[JobStarted, JobFinished, JobFailed, JobRequeued, SlotChanged]


@dataclass
class SlotStatus:
    """A slot as a fleet view shows it."""

    info: SlotInfo
    state: SlotState = "idle"
    job: EvalJob | None = None
    phase: str = ""
    """The running evaluation's current step ("forward on S1", "timing S2", ...), '' when idle."""
    evaluations: int = 0
    faults: list[str] = field(default_factory=list)


class EvaluationPool(Protocol):
    """Evaluation slots behind one queue. Thread-safe: submit and cancel from any thread; drain from one."""

    def slots(self) -> list[SlotStatus]:
        """Every slot and what it is doing (a snapshot)."""
        ...

    def submit(self, job: EvalJob) -> None:
        """Queue a job; it runs when a slot is free, higher priority first."""
        ...

    def events(self, timeout: float | None = None) -> list[PoolEvent]:
        """What happened since the last call, in order; waits up to `timeout` seconds for at least one event, or
        until wake()."""
        ...

    def wake(self) -> None:
        """End the wait of events() now, or of its next call when none is waiting (another thread has news for the
        drainer: a model reply came in)."""
        ...

    def pending(self) -> int:
        """Jobs queued or running."""
        ...

    def reference(self) -> str | None:
        """The slot that confirms a new best (pin its held-out job there with EvalJob.slot), so every standing
        best was measured on one GPU: the first slot still taking jobs; None when none is."""
        ...

    def cancel(self, job_id: str) -> bool:
        """Drop a queued job (a JobFailed with cancelled=True follows); False when it is running or unknown."""
        ...

    def cancel_all(self) -> None:
        """Drop every queued job and abort the running ones where the slot can (the run is stopping)."""
        ...

    def close(self) -> None:
        """Stop every slot and release its processes; no event follows."""
        ...
