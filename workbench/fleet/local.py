"""LocalPool: evaluation slots as threads of this process, each driving its own evaluator, behind one queue.

Each slot has a thread that takes the highest-priority job it may run (its own pinned jobs, or any unpinned job of
its device), evaluates it with the slot's runner and posts the outcome. The runner does the real work in other
processes (an EvaluationService per GPU, a Ray actor), so the threads only wait. The pool never journals: the
runtime drains `events()` from its own thread.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from workbench.fleet.api import (
    EvalJob,
    JobFailed,
    JobFinished,
    JobStarted,
    PoolEvent,
    SlotChanged,
    SlotInfo,
    SlotStatus,
)

if TYPE_CHECKING:
    from workbench.evaluator.result import EvalResult


class SlotRunner(Protocol):
    """What a slot evaluates with (an evaluation service on one GPU, a remote actor, a test double)."""

    def run(self, job: EvalJob) -> "EvalResult":
        """Evaluate one job and return its result.

        Raises:
            Exception: the trusted side failed on this job (the pool reports JobFailed and keeps the slot).
        """
        ...

    def close(self) -> None:
        """Release the runner's processes."""
        ...


class LocalPool:
    """Slots of this process behind one priority queue (EvaluationPool).

    Args:
        slots: each slot's description and the runner it evaluates with.
    """

    def __init__(self, slots: Sequence[tuple[SlotInfo, SlotRunner]]) -> None:
        if not slots:
            raise ValueError("a pool needs at least one slot")
        self._cond = threading.Condition()
        self._queue: list[tuple[int, int, EvalJob]] = []
        """(priority, order, job) heap of jobs no slot has taken yet."""
        self._order = itertools.count()
        self._events: deque[PoolEvent] = deque()
        self._status = {info.slot: SlotStatus(info) for info, _ in slots}
        self._runners = {info.slot: runner for info, runner in slots}
        self._running: dict[str, EvalJob] = {}
        """Job id -> job, for jobs a slot is evaluating now."""
        self._closed = False
        self._threads = [threading.Thread(target=self._serve, args=(info,), name=f"slot {info.slot}", daemon=True)
                         for info, _ in slots]
        for thread in self._threads:
            thread.start()

    # -- the queue -----------------------------------------------------------------------------------
    def submit(self, job: EvalJob) -> None:
        """Queue a job (ValueError for a job pinned to a slot this pool does not have)."""
        if job.slot is not None and job.slot not in self._status:
            raise ValueError(f"job {job.id}: no slot {job.slot!r} in this pool ({', '.join(self._status)})")
        with self._cond:
            if self._closed:
                raise RuntimeError("the evaluation pool is closed")
            heapq.heappush(self._queue, (job.priority, next(self._order), job))
            self._cond.notify_all()

    def _take(self, info: SlotInfo) -> EvalJob | None:
        """The best queued job this slot may run, removed from the queue (the lock is held)."""
        for entry in sorted(self._queue):
            if entry[2].slot in (None, info.slot):
                self._queue.remove(entry)
                heapq.heapify(self._queue)
                return entry[2]
        return None

    def _serve(self, info: SlotInfo) -> None:
        runner = self._runners[info.slot]
        while True:
            with self._cond:
                job = None
                while not self._closed:
                    status = self._status[info.slot]
                    if status.state in ("idle", "faulted"):
                        job = self._take(info)
                        if job is not None:
                            break
                    self._cond.wait()
                if job is None:
                    return
                status.state, status.job, status.phase = "busy", job, "starting"
                self._running[job.id] = job
                self._events.append(JobStarted(job, info))
                self._cond.notify_all()
            event: PoolEvent
            try:
                event = JobFinished(job, info, runner.run(job))
            except Exception as exc:  # noqa: BLE001 - the trusted side failed: reported, the slot carries on
                event = JobFailed(job, info, f"{type(exc).__name__}: {exc}"[:500])
            with self._cond:
                self._running.pop(job.id, None)
                status = self._status[info.slot]
                status.evaluations += 1
                if status.state == "busy":
                    status.state = "idle"
                status.job, status.phase = None, ""
                if not self._closed:
                    self._events.append(event)
                self._cond.notify_all()

    # -- reporting -----------------------------------------------------------------------------------
    def events(self, timeout: float | None = None) -> list[PoolEvent]:
        """Events since the last call, waiting up to `timeout` s for one (None: wait until there is one)."""
        with self._cond:
            if not self._events and not self._closed:
                self._cond.wait_for(lambda: bool(self._events) or self._closed, timeout)
            out = list(self._events)
            self._events.clear()
            return out

    def pending(self) -> int:
        """Jobs queued or running."""
        with self._cond:
            return len(self._queue) + len(self._running)

    def slots(self) -> list[SlotStatus]:
        """A snapshot of every slot."""
        with self._cond:
            return [SlotStatus(s.info, s.state, s.job, s.phase, s.evaluations, list(s.faults))
                    for s in self._status.values()]

    def set_phase(self, slot: str, phase: str) -> None:
        """A runner's progress report (the running evaluation's current step), for fleet views."""
        with self._cond:
            if slot in self._status:
                self._status[slot].phase = phase

    def mark(self, slot: str, state: str, message: str = "") -> None:
        """A runner's or a fault policy's change of a slot's state (faulted, retired, skipped), reported as an
        event; a retired or skipped slot takes no more jobs."""
        with self._cond:
            status = self._status[slot]
            status.state = state  # type: ignore[assignment]
            if message:
                status.faults.append(message)
            self._events.append(SlotChanged(status.info, state, message))  # type: ignore[arg-type]
            self._cond.notify_all()

    # -- stopping ------------------------------------------------------------------------------------
    def cancel(self, job_id: str) -> bool:
        """Drop a queued job; False when it is running or unknown."""
        with self._cond:
            for entry in self._queue:
                if entry[2].id == job_id:
                    self._queue.remove(entry)
                    heapq.heapify(self._queue)
                    self._events.append(JobFailed(entry[2], None, "cancelled", cancelled=True))
                    self._cond.notify_all()
                    return True
            return False

    def cancel_all(self) -> None:
        """Drop every queued job (running ones finish: a runner that can abort does so in close())."""
        with self._cond:
            for _, _, job in sorted(self._queue):
                self._events.append(JobFailed(job, None, "cancelled", cancelled=True))
            self._queue.clear()
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the slots' threads and close every runner."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        for runner in self._runners.values():
            try:
                runner.close()
            except Exception:  # noqa: BLE001 - closing one runner must not keep the others open
                pass
        for thread in self._threads:
            thread.join(timeout=5)
