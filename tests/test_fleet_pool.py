"""LocalPool: priorities, pinned jobs, failures, cancellation and shutdown, with runners that only wait."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from workbench.fleet.api import EvalJob, JobFailed, JobFinished, JobStarted, SlotChanged, SlotInfo
from workbench.fleet.local import LocalPool


class Gate:
    """A runner whose jobs finish when the test releases them (or at once when open)."""

    def __init__(self, open_: bool = True, fail: set[str] | None = None) -> None:
        self.release = threading.Event()
        if open_:
            self.release.set()
        self.fail = fail or set()
        self.ran: list[str] = []
        self.closed = False

    def run(self, job: EvalJob):
        self.ran.append(job.id)
        self.release.wait(10)
        if job.id in self.fail:
            raise RuntimeError("service died twice")
        return {"verdict": "ok", "attempt": job.attempt}

    def close(self) -> None:
        self.closed = True
        self.release.set()


def job(name: str, kind: str = "candidate", slot: str | None = None) -> EvalJob:
    return EvalJob(name, 1, Path(f"{name}.py"), "", kind=kind, slot=slot)  # type: ignore[arg-type]


def drain(pool: LocalPool, finished: int, timeout: float = 10.0) -> list:
    out: list = []
    end = time.monotonic() + timeout
    while sum(isinstance(e, (JobFinished, JobFailed)) for e in out) < finished and time.monotonic() < end:
        out += pool.events(0.5)
    return out


def test_higher_priority_runs_first_and_fifo_within_a_kind():
    gate = Gate(open_=False)
    pool = LocalPool([(SlotInfo("cpu:0", "cpu"), gate)])
    try:
        pool.submit(job("blocker"))
        time.sleep(0.2)  # the slot holds the blocker; the rest queue behind it
        for name, kind in (("c1", "candidate"), ("p1", "profile"), ("c2", "candidate"), ("h1", "heldout")):
            pool.submit(job(name, kind))
        gate.release.set()
        events = drain(pool, 5)
        assert [e.job.id for e in events if isinstance(e, JobStarted)] == ["blocker", "h1", "p1", "c1", "c2"]
    finally:
        pool.close()


def test_two_slots_run_at_once_and_results_name_their_slot():
    gates = [Gate(open_=False), Gate(open_=False)]
    pool = LocalPool([(SlotInfo(f"cpu:{i}", "cpu"), g) for i, g in enumerate(gates)])
    try:
        pool.submit(job("a"))
        pool.submit(job("b"))
        time.sleep(0.3)
        assert {s.job.id for s in pool.slots() if s.job} == {"a", "b"}
        assert pool.pending() == 2
        for g in gates:
            g.release.set()
        finished = [e for e in drain(pool, 2) if isinstance(e, JobFinished)]
        assert {e.job.id: e.slot.slot for e in finished} == {"a": "cpu:0", "b": "cpu:1"} or \
            {e.job.id: e.slot.slot for e in finished} == {"a": "cpu:1", "b": "cpu:0"}
        assert pool.pending() == 0
    finally:
        pool.close()


def test_a_pinned_job_waits_for_its_slot():
    busy, free = Gate(open_=False), Gate()
    pool = LocalPool([(SlotInfo("cuda:0", "cuda", gpu="0"), busy), (SlotInfo("cuda:1", "cuda", gpu="1"), free)])
    try:
        pool.submit(job("long", slot="cuda:0"))
        time.sleep(0.2)
        pool.submit(job("confirm", "heldout", slot="cuda:0"))
        pool.submit(job("other"))
        events = drain(pool, 1)
        assert [e.job.id for e in events if isinstance(e, JobFinished)] == ["other"]  # cuda:1 never takes it
        busy.release.set()
        events = drain(pool, 2)
        assert {e.job.id: e.slot.slot for e in events if isinstance(e, JobFinished)} == {"long": "cuda:0",
                                                                                         "confirm": "cuda:0"}
        with pytest.raises(ValueError, match="no slot"):
            pool.submit(job("x", slot="cuda:7"))
    finally:
        pool.close()


def test_a_runner_failure_is_reported_and_the_slot_carries_on():
    pool = LocalPool([(SlotInfo("cpu:0", "cpu"), Gate(fail={"bad"}))])
    try:
        pool.submit(job("bad"))
        pool.submit(job("good"))
        events = drain(pool, 2)
        failed = [e for e in events if isinstance(e, JobFailed)]
        assert [e.job.id for e in failed] == ["bad"] and "service died twice" in failed[0].message
        assert [e.job.id for e in events if isinstance(e, JobFinished)] == ["good"]
    finally:
        pool.close()


def test_cancel_drops_queued_jobs_only_and_retired_slots_take_no_more():
    gate = Gate(open_=False)
    pool = LocalPool([(SlotInfo("cpu:0", "cpu"), gate)])
    try:
        pool.submit(job("running"))
        time.sleep(0.2)
        pool.submit(job("queued1"))
        pool.submit(job("queued2"))
        assert pool.cancel("running") is False
        assert pool.cancel("queued1") is True
        pool.cancel_all()
        gate.release.set()
        events = drain(pool, 3)
        assert {e.job.id for e in events if isinstance(e, JobFailed) and e.cancelled} == {"queued1", "queued2"}
        assert [e.job.id for e in events if isinstance(e, JobFinished)] == ["running"]
        pool.mark("cpu:0", "retired", "faulted twice")
        pool.submit(job("after"))
        events = pool.events(0.5)
        assert any(isinstance(e, SlotChanged) and e.state == "retired" for e in events)
        assert not any(isinstance(e, JobStarted) for e in events)
        assert pool.slots()[0].faults == ["faulted twice"]
    finally:
        pool.close()
    assert gate.closed
