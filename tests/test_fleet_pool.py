"""LocalPool: priorities, pinned jobs, failures, cancellation and shutdown, with runners that only wait."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from workbench.fleet.api import EvalJob, JobFailed, JobFinished, JobRequeued, JobStarted, SlotChanged, SlotInfo
from workbench.fleet.local import LocalPool, SlotFault


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

    def abort(self) -> None:
        self.release.set()

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
        # the running job is aborted (its runner's abort() let it return): it ends cancelled, not finished
        assert {e.job.id for e in events if isinstance(e, JobFailed) and e.cancelled} == {"queued1", "queued2",
                                                                                          "running"}
        assert not [e for e in events if isinstance(e, JobFinished)]
        pool.submit(job("next"))
        assert [type(e) for e in drain(pool, 1)] == [JobStarted, JobFinished]  # the pool still serves
        pool.mark("cpu:0", "retired", "faulted twice")
        pool.submit(job("after"))
        events = pool.events(0.5)
        assert any(isinstance(e, SlotChanged) and e.state == "retired" for e in events)
        assert not any(isinstance(e, JobStarted) for e in events)
        assert [e.job.id for e in events if isinstance(e, JobFailed)] == ["after"]
        assert pool.slots()[0].faults == ["faulted twice"] and pool.reference() is None
    finally:
        pool.close()
    assert gate.closed


class Faulty:
    """A runner that raises SlotFault for the jobs named (the trusted side failing under them)."""

    def __init__(self, faults: dict[str, SlotFault] | None = None, once: bool = False) -> None:
        self.faults = faults or {}
        self.once = once
        """Each fault happens once (the replaced service is sound)."""
        self.ran: list[str] = []
        self.closed = False
        self.release = threading.Event()

    def run(self, job: EvalJob):
        self.ran.append(job.id)
        if job.id.startswith("blocker"):
            self.release.wait(10)
        if job.id in self.faults:
            raise self.faults.pop(job.id) if self.once else self.faults[job.id]
        return {"verdict": "ok", "attempt": job.attempt}

    def abort(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def test_a_fault_moves_the_job_to_another_slot_once_and_a_second_fault_retires_the_slot():
    bad = Faulty({"a": SlotFault("service died twice"), "b": SlotFault("CUDA context lost")})
    good = Faulty()
    pool = LocalPool([(SlotInfo("cuda:0", "cuda", gpu="0"), bad), (SlotInfo("cuda:1", "cuda", gpu="1"), good)])
    try:
        pool.submit(job("blocker", slot="cuda:1"))
        time.sleep(0.2)
        pool.submit(job("a"))  # cuda:0 takes it: cuda:1 is busy
        time.sleep(0.2)
        good.release.set()
        events = drain(pool, 2)
        moved = [e for e in events if isinstance(e, JobRequeued)]
        assert [(e.job.id, e.slot.slot) for e in moved] == [("a", "cuda:0")]
        assert [(e.slot.slot, e.state) for e in events if isinstance(e, SlotChanged)] == [("cuda:0", "faulted")]
        assert [(e.job.id, e.slot.slot) for e in events if isinstance(e, JobStarted)] == [
            ("blocker", "cuda:1"), ("a", "cuda:0"), ("a", "cuda:1")]
        assert [(e.job.id, e.slot.slot) for e in events if isinstance(e, JobFinished)] == [("blocker", "cuda:1"),
                                                                                           ("a", "cuda:1")]
        assert pool.reference() == "cuda:0"  # faulted once: replaced, still taking jobs
        good.release.clear()
        pool.submit(job("blocker2", slot="cuda:1"))
        time.sleep(0.2)
        pool.submit(job("b"))
        time.sleep(0.2)
        good.release.set()
        events = drain(pool, 2)
        assert ("cuda:0", "retired", "CUDA context lost") in [(e.slot.slot, e.state, e.message) for e in events
                                                               if isinstance(e, SlotChanged)]
        assert [(e.job.id, e.slot.slot) for e in events if isinstance(e, JobFinished)] == [("blocker2", "cuda:1"),
                                                                                           ("b", "cuda:1")]
        assert pool.reference() == "cuda:1"
        time.sleep(0.2)
        assert bad.closed and not good.closed
        for name in ("c", "d"):
            pool.submit(job(name))
        drain(pool, 2)
        assert bad.ran == ["a", "b"] and good.ran == ["blocker", "a", "blocker2", "b", "c", "d"]
        assert {s.info.slot: (s.state, s.faults) for s in pool.slots()}["cuda:0"] == (
            "retired", ["service died twice", "CUDA context lost"])
    finally:
        pool.close()


def test_a_job_that_fails_on_two_slots_fails_and_none_is_lost():
    fault = SlotFault("actor lost", retire=True)
    pool = LocalPool([(SlotInfo(f"cpu:{i}", "cpu"), Faulty({"x": fault})) for i in range(3)])
    try:
        pool.submit(job("x"))
        pool.submit(job("y"))
        events = drain(pool, 2)
        ends = [e for e in events if isinstance(e, (JobFinished, JobFailed))]
        assert sorted(e.job.id for e in ends) == ["x", "y"]  # one end per job
        failed = next(e for e in ends if e.job.id == "x")
        assert isinstance(failed, JobFailed) and not failed.cancelled
        assert "two slots" in failed.message and failed.message.count("actor lost") == 2
        assert len([e for e in events if isinstance(e, JobRequeued)]) == 1
        assert sum(1 for s in pool.slots() if s.state == "retired") == 2
    finally:
        pool.close()


def test_a_fault_the_service_recovered_from_keeps_the_result_and_marks_the_slot():
    result = {"verdict": "crash", "message": "segfault"}
    pool = LocalPool([(SlotInfo("cuda:0", "cuda", gpu="0"), Faulty({"a": SlotFault("unhealthy", result=result)}))])
    try:
        pool.submit(job("a"))
        events = drain(pool, 1)
        assert [type(e).__name__ for e in events] == ["JobStarted", "SlotChanged", "JobFinished"]
        assert events[-1].result is result and events[1].state == "faulted"
        pool.submit(job("b"))  # a faulted slot still takes jobs
        assert [e.job.id for e in drain(pool, 1) if isinstance(e, JobFinished)] == ["b"]
    finally:
        pool.close()


def test_with_one_slot_a_faulted_job_runs_again_there_and_a_retired_last_slot_fails_what_is_queued():
    runner = Faulty({"a": SlotFault("service died twice")}, once=True)
    pool = LocalPool([(SlotInfo("cuda:0", "cuda", gpu="0"), runner)])
    try:
        pool.submit(job("a"))
        events = drain(pool, 1)
        assert [type(e).__name__ for e in events] == ["JobStarted", "SlotChanged", "JobRequeued", "JobStarted",
                                                      "JobFinished"]
        assert {e.slot.slot for e in events} == {"cuda:0"} and runner.ran == ["a", "a"]
    finally:
        pool.close()
    gate = Gate(open_=False, fail=set())
    pool = LocalPool([(SlotInfo("cuda:0", "cuda", gpu="0"), gate)])
    try:
        pool.submit(job("running"))
        time.sleep(0.2)
        pool.submit(job("queued", "heldout", slot="cuda:0"))
        pool.mark("cuda:0", "retired", "lost")
        events = pool.events(0.5)
        assert [(e.job.id, e.message) for e in events if isinstance(e, JobFailed)] == [
            ("queued", "its slot cuda:0 takes no more jobs (retired)")]
        gate.release.set()
        assert [e.job.id for e in drain(pool, 1) if isinstance(e, JobFinished)] == ["running"]
    finally:
        pool.close()


def test_skipped_slots_are_reported_and_never_used():
    busy = SlotInfo("cuda:0", "cuda", gpu="0", gpu_name="NVIDIA H200")
    free = Faulty()
    pool = LocalPool([(SlotInfo("cuda:1", "cuda", gpu="1"), free)], skipped=[(busy, "pid 42 holds 70 GiB")])
    try:
        events = pool.events(0.1)
        assert [(e.slot.slot, e.state, e.message) for e in events] == [("cuda:0", "skipped", "pid 42 holds 70 GiB")]
        assert pool.reference() == "cuda:1"
        pool.submit(job("a"))
        pool.submit(job("pinned", slot="cuda:0"))
        events = drain(pool, 2)
        assert [e.slot.slot for e in events if isinstance(e, JobFinished)] == ["cuda:1"]
        assert [e.job.id for e in events if isinstance(e, JobFailed)] == ["pinned"]
        assert [s.state for s in pool.slots()] == ["idle", "skipped"]
    finally:
        pool.close()


def test_jobs_queued_for_a_slot_that_a_fault_retires_fail_instead_of_waiting_forever():
    runner = Faulty({"blocker": SlotFault("actor lost", retire=True)})
    pool = LocalPool([(SlotInfo("ray:b:cuda:0", "cuda", gpu="0"), runner)])
    try:
        pool.submit(job("blocker"))
        time.sleep(0.2)
        pool.submit(job("pinned", "heldout", slot="ray:b:cuda:0"))
        pool.submit(job("any"))
        runner.release.set()
        events = drain(pool, 3)
        failed = {e.job.id: e.message for e in events if isinstance(e, JobFailed)}
        assert failed["pinned"] == "its slot ray:b:cuda:0 takes no more jobs (retired)"
        assert failed["any"] == "no slot takes jobs any more (every slot retired or skipped)"
        assert "blocker" in failed and pool.pending() == 0 and runner.closed
    finally:
        pool.close()


def test_wake_ends_a_wait_for_events_at_once_and_a_wake_before_the_wait_is_kept_for_it():
    pool = LocalPool([(SlotInfo("cpu:0", "cpu"), Gate())])
    try:
        pool.wake()
        started = time.monotonic()
        assert pool.events(30) == [] and time.monotonic() - started < 5
        threading.Timer(0.2, pool.wake).start()
        started = time.monotonic()
        assert pool.events(30) == [] and time.monotonic() - started < 5
        started = time.monotonic()
        assert pool.events(0.3) == [] and time.monotonic() - started >= 0.25, "a wake is used up by one wait"
    finally:
        pool.close()
