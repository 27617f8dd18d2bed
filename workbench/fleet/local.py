"""LocalPool: evaluation slots as threads of this process, each driving its own evaluator, behind one queue.

Each slot has a thread that takes the highest-priority job it may run (its own pinned jobs, or any unpinned job of
its device), evaluates it with the slot's runner and posts the outcome. The runner does the real work in other
processes (an EvaluationService per GPU, a Ray actor), so the threads only wait. The pool never journals: the
runtime drains `events()` from its own thread.

Faults are the pool's policy, whatever the runner: a runner raises SlotFault when its trusted side failed (it has
replaced its service where it could); the slot is marked faulted, or retired on its RETIRE_AFTER-th fault or when
the runner cannot go on, and a job without a result goes to another slot once (JobRequeued), then fails.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from workbench.fleet.api import (
    RETIRE_AFTER,
    EvalJob,
    JobFailed,
    JobFinished,
    JobRequeued,
    JobStarted,
    PoolEvent,
    SlotChanged,
    SlotInfo,
    SlotState,
    SlotStatus,
)

if TYPE_CHECKING:
    from workbench.evaluator.result import EvalResult

TAKING: tuple[SlotState, ...] = ("idle", "busy", "faulted")
"""States of a slot that still takes jobs."""


class SlotFault(Exception):
    """A slot's trusted side failed during a job: not the candidate's doing (its crash is a result).

    Args:
        message: what failed, one line.
        result: the job's result when the service recovered on its own and re-ran it (the result stands), None
            when the job has none (it goes to another slot).
        retire: the runner cannot take more jobs (a lost Ray actor, a service that cannot be replaced).
    """

    def __init__(self, message: str, *, result: "EvalResult | None" = None, retire: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.result = result
        self.retire = retire


class SlotRunner(Protocol):
    """What a slot evaluates with (an evaluation service on one GPU, a remote actor, a test double)."""

    def run(self, job: EvalJob) -> "EvalResult":
        """Evaluate one job and return its result.

        Raises:
            SlotFault: the trusted side failed (the pool marks the slot and moves the job; see SlotFault).
            Exception: anything else: the job fails (JobFailed) and the slot carries on.
        """
        ...

    def abort(self) -> None:
        """Stop the job in flight from another thread, soon, if the runner can (run() may then raise anything:
        the pool reports the job as cancelled)."""
        ...

    def close(self) -> None:
        """Release the runner's processes."""
        ...


@dataclass(order=True)
class _Queued:
    priority: int
    order: int
    job: EvalJob = field(compare=False)
    avoid: str | None = field(default=None, compare=False)
    """The slot the job left after a fault: it goes elsewhere while another slot takes jobs."""


class LocalPool:
    """Slots of this process behind one priority queue (EvaluationPool).

    Args:
        slots: each slot's description and the runner it evaluates with, in order (the first is the reference).
        skipped: slots that are reported but never used, with why (a GPU busy with someone else's job).
    """

    def __init__(self, slots: Sequence[tuple[SlotInfo, SlotRunner]],
                 skipped: Sequence[tuple[SlotInfo, str]] = ()) -> None:
        if not slots:
            raise ValueError("a pool needs at least one slot")
        self._cond = threading.Condition()
        self._queue: list[_Queued] = []
        """Heap of jobs no slot has taken yet."""
        self._order = itertools.count()
        self._events: deque[PoolEvent] = deque()
        self._status = {info.slot: SlotStatus(info) for info, _ in slots}
        self._runners = {info.slot: runner for info, runner in slots}
        self._running: dict[str, tuple[EvalJob, int]] = {}
        """Job id -> (job, its queue order), for jobs a slot is evaluating now."""
        self._cancelled: set[str] = set()
        """Running jobs that cancel_all() aborted: whatever their runner returns, they end as cancelled."""
        self._requeued: dict[str, str] = {}
        """Job id -> why it left its first slot (a job moves once)."""
        self._closed = False
        self._woken = False
        """wake() was called since events() last returned."""
        for info, reason in skipped:
            self._status[info.slot] = SlotStatus(info, "skipped", faults=[reason])
            self._events.append(SlotChanged(info, "skipped", reason))
        self._threads = [threading.Thread(target=self._serve, args=(info,), name=f"slot {info.slot}", daemon=True)
                         for info, _ in slots]
        for thread in self._threads:
            thread.start()

    # -- the queue -----------------------------------------------------------------------------------
    def submit(self, job: EvalJob) -> None:
        """Queue a job (ValueError for a job pinned to a slot this pool does not have; a job that no slot can take
        any more fails at once with JobFailed)."""
        if job.slot is not None and job.slot not in self._status:
            raise ValueError(f"job {job.id}: no slot {job.slot!r} in this pool ({', '.join(self._status)})")
        with self._cond:
            if self._closed:
                raise RuntimeError("the evaluation pool is closed")
            self._push(_Queued(job.priority, next(self._order), job))

    def _push(self, entry: _Queued) -> None:
        """Queue an entry, or fail it when no slot can take it (the lock is held)."""
        why = self._unservable(entry.job)
        if why:
            self._events.append(JobFailed(entry.job, None, why))
        else:
            heapq.heappush(self._queue, entry)
        self._cond.notify_all()

    def _taking(self) -> list[str]:
        return [name for name, s in self._status.items() if s.state in TAKING]

    def _unservable(self, job: EvalJob) -> str:
        """Why no slot can take the job any more ('' when one can)."""
        taking = self._taking()
        if job.slot is not None and job.slot not in taking:
            return f"its slot {job.slot} takes no more jobs ({self._status[job.slot].state})"
        if not taking:
            return "no slot takes jobs any more (every slot retired or skipped)"
        return ""

    def _take(self, info: SlotInfo) -> EvalJob | None:
        """The best queued job this slot may run, removed from the queue (the lock is held)."""
        taking = self._taking()
        for entry in sorted(self._queue):
            if entry.job.slot not in (None, info.slot):
                continue
            if entry.avoid == info.slot and entry.job.slot is None and any(s != info.slot for s in taking):
                continue
            self._queue.remove(entry)
            heapq.heapify(self._queue)
            self._running[entry.job.id] = (entry.job, entry.order)
            return entry.job
        return None

    def _serve(self, info: SlotInfo) -> None:
        runner = self._runners[info.slot]
        while True:
            job = self._next(info)
            if job is None:
                if not self._closed:
                    self._close_runner(runner)  # retired from outside (mark)
                return
            result: EvalResult | None = None
            fault: SlotFault | None = None
            error = ""
            try:
                result = runner.run(job)
            except SlotFault as exc:
                fault = exc
            except Exception as exc:  # noqa: BLE001 - the trusted side failed: reported, the slot carries on
                error = f"{type(exc).__name__}: {exc}"[:500]
            if self._finish(info, job, result, fault, error):
                self._close_runner(runner)
                return

    def _next(self, info: SlotInfo) -> EvalJob | None:
        """Wait for a job this slot may run and mark the slot busy with it; None when the pool closes or the slot
        stops taking jobs."""
        with self._cond:
            while not self._closed:
                status = self._status[info.slot]
                if status.state not in TAKING:
                    return None
                job = self._take(info)
                if job is not None:
                    status.state, status.job, status.phase = "busy", job, "starting"
                    self._events.append(JobStarted(job, info))
                    self._cond.notify_all()
                    return job
                self._cond.wait()
            return None

    @staticmethod
    def _close_runner(runner: SlotRunner) -> None:
        try:
            runner.close()
        except Exception:  # noqa: BLE001 - closing one runner must not keep the others open
            pass

    def _finish(self, info: SlotInfo, job: EvalJob, result: "EvalResult | None", fault: SlotFault | None,
                error: str) -> bool:
        """Post what came of a job and apply the fault policy; True when the slot was retired."""
        with self._cond:
            _, order = self._running.pop(job.id)
            status = self._status[info.slot]
            status.evaluations += 1
            status.job, status.phase = None, ""
            if status.state == "busy":
                status.state = "faulted" if status.faults else "idle"
            retired = False
            if fault is not None:
                result = fault.result
                status.faults.append(fault.message)
                retired = fault.retire or len(status.faults) >= RETIRE_AFTER
                status.state = "retired" if retired else "faulted"
                if not self._closed:
                    self._events.append(SlotChanged(info, status.state, fault.message))
            if self._closed:
                pass
            elif job.id in self._cancelled:
                self._cancelled.discard(job.id)
                self._events.append(JobFailed(job, info, "cancelled", cancelled=True))
            elif result is not None:
                self._events.append(JobFinished(job, info, result))
            elif fault is not None:
                self._move(job, order, info, fault.message)
            else:
                self._events.append(JobFailed(job, info, error))
            if retired:
                self._strand()
            self._cond.notify_all()
            return retired

    def _move(self, job: EvalJob, order: int, info: SlotInfo, message: str) -> None:
        """A job whose slot failed under it: queued again once (elsewhere where possible), else failed."""
        first = self._requeued.get(job.id)
        if first is not None:
            self._events.append(JobFailed(job, info, f"the trusted side failed on two slots: {first}; then "
                                                     f"{info.slot}: {message}"[:500]))
            return
        self._requeued[job.id] = f"{info.slot}: {message}"
        self._events.append(JobRequeued(job, info, message))
        self._push(_Queued(job.priority, order, job, avoid=info.slot))

    def _strand(self) -> None:
        """After a retirement: fail the queued jobs that no slot can take any more (the lock is held)."""
        for entry in sorted(self._queue):
            why = self._unservable(entry.job)
            if why:
                self._queue.remove(entry)
                self._events.append(JobFailed(entry.job, None, why))
        heapq.heapify(self._queue)

    # -- reporting -----------------------------------------------------------------------------------
    def events(self, timeout: float | None = None) -> list[PoolEvent]:
        """Events since the last call, waiting up to `timeout` s for one (None: wait until there is one) or wake()."""
        with self._cond:
            if not self._events and not self._closed and not self._woken:
                self._cond.wait_for(lambda: bool(self._events) or self._closed or self._woken, timeout)
            self._woken = False
            out = list(self._events)
            self._events.clear()
            return out

    def wake(self) -> None:
        """End the wait of events() now (or of its next call)."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def pending(self) -> int:
        """Jobs queued or running."""
        with self._cond:
            return len(self._queue) + len(self._running)

    def reference(self) -> str | None:
        """The first slot still taking jobs: where a new best is confirmed."""
        with self._cond:
            taking = self._taking()
            return taking[0] if taking else None

    def slots(self) -> list[SlotStatus]:
        """A snapshot of every slot."""
        with self._cond:
            return [SlotStatus(s.info, s.state, s.job, s.phase, s.evaluations, list(s.faults))
                    for s in self._status.values()]

    def runner(self, slot: str) -> SlotRunner:
        """The slot's runner (for tools and tests that watch its processes; KeyError for a skipped slot)."""
        return self._runners[slot]

    def set_phase(self, slot: str, phase: str) -> None:
        """A runner's progress report (the running evaluation's current step), for fleet views."""
        with self._cond:
            if slot in self._status:
                self._status[slot].phase = phase

    def mark(self, slot: str, state: SlotState, message: str = "") -> None:
        """A change of a slot's state from outside the fault policy (faulted, retired, skipped), reported as an
        event; a retired or skipped slot takes no more jobs (its runner is closed when its thread sees it)."""
        with self._cond:
            status = self._status[slot]
            status.state = state
            if message:
                status.faults.append(message)
            self._events.append(SlotChanged(status.info, state, message))
            if state not in TAKING:
                self._strand()
            self._cond.notify_all()

    # -- stopping ------------------------------------------------------------------------------------
    def cancel(self, job_id: str) -> bool:
        """Drop a queued job; False when it is running or unknown."""
        with self._cond:
            for entry in self._queue:
                if entry.job.id == job_id:
                    self._queue.remove(entry)
                    heapq.heapify(self._queue)
                    self._events.append(JobFailed(entry.job, None, "cancelled", cancelled=True))
                    self._cond.notify_all()
                    return True
            return False

    def cancel_all(self) -> None:
        """Drop every queued job and abort the running ones (each ends as JobFailed with cancelled=True)."""
        with self._cond:
            for entry in sorted(self._queue):
                self._events.append(JobFailed(entry.job, None, "cancelled", cancelled=True))
            self._queue.clear()
            self._cancelled.update(self._running)
            busy = [self._runners[name] for name, s in self._status.items() if s.state == "busy"]
            self._cond.notify_all()
        for runner in busy:
            try:
                runner.abort()
            except Exception:  # noqa: BLE001 - aborting one runner must not keep the others running
                pass

    def close(self) -> None:
        """Stop the slots' threads and close every runner (aborting evaluations in flight); no event follows."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        for runner in self._runners.values():
            self._close_runner(runner)
        for thread in self._threads:
            thread.join(timeout=5)
