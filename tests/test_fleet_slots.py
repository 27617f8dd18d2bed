"""Evaluation slots for real on the CPU (Triton interpreter): two services at once, where each result was measured,
a candidate's crash as a result, a service that dies under a job (replaced, the job moved, the slot retired on its
second fault), and cancellation that kills what runs."""

from __future__ import annotations

import functools
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from workbench.evaluator import EvaluationService
from workbench.evaluator.selftest import CASES_DIR
from workbench.fleet import gpus
from workbench.fleet.api import JobFailed, JobFinished, JobRequeued, JobStarted, SlotChanged, SlotInfo
from workbench.fleet.factory import make_pool
from workbench.fleet.local import LocalPool
from workbench.fleet.runner import ServiceRunner
from workbench.tasks import load_task

from fleet_jobs import drain, job

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "kernels" / "softmax" / "seed.py"
GOOD = CASES_DIR / "softmax" / "good_simple.py"
SEGFAULT = CASES_DIR / "softmax" / "segfault.py"
LOOP = CASES_DIR / "softmax" / "infinite_loop.py"
OPTIONS = {"prepare_heldout": False, "secret_seeds": False}

pytestmark = pytest.mark.slow


def drain_until(pool, found, timeout: float = 30.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while not any(found(e) for e in out):
        assert time.monotonic() < deadline, f"timed out waiting; events so far: {out}"
        out += pool.events(0.2)
    return out


def descendants() -> set[int]:
    return gpus.own_pids() - {os.getpid()}


def test_two_cpu_slots_evaluate_at_once_and_say_where_they_measured():
    task = load_task("softmax")
    pool = make_pool(task, "cpu", workers=2, service_options=OPTIONS)
    try:
        assert [s.info.slot for s in pool.slots()] == ["cpu:0", "cpu:1"] and pool.reference() == "cpu:0"
        # each slot's service runs on CPUs of its own (its candidates do too: they are pinned where they import)
        masks = [os.sched_getaffinity(pool.runner(f"cpu:{i}").service.health().pid) for i in range(2)]
        assert masks == [{0}, {1}]
        pool.submit(job("seed", SEED))
        pool.submit(job("crash", SEGFAULT))
        events = drain(pool, 2)
        started = [e for e in events if isinstance(e, JobStarted)]
        assert {e.slot.slot for e in started} == {"cpu:0", "cpu:1"}  # both ran at once, one per slot
        done = {e.job.id: e for e in events if isinstance(e, JobFinished)}
        assert done["seed"].result["verdict"] == "ok" and done["crash"].result["verdict"] == "crash"
        for e in done.values():
            assert e.result["measured_on"] == {"slot": e.slot.slot, "device": "cpu", "gpu": None, "gpu_name": None,
                                               "host": socket.gethostname()}
        # the candidate's crash is its result, not a fault of the slot
        assert not [e for e in events if isinstance(e, SlotChanged)]
        assert all(s.state == "idle" and not s.faults for s in pool.slots())
    finally:
        pool.close()


def _killer(runner: ServiceRunner, pool: LocalPool, slot: str, times: int) -> list[int]:
    """Kill the slot's service process when its evaluation announces a candidate step, `times` times (from the
    runner's progress callback, so each kill hits a service that is evaluating)."""
    killed: list[int] = []

    def on_phase(phase: str) -> None:
        pool.set_phase(slot, phase)
        service = runner.service
        pid = service.health().pid if service is not None else None
        if len(killed) < times and pid and pid not in killed and phase.startswith("forward"):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    runner.on_phase = on_phase
    return killed


def test_a_service_that_dies_under_a_job_is_replaced_the_job_moves_and_a_second_fault_retires_the_slot():
    task = load_task("softmax")
    infos = [SlotInfo(f"cpu:{i}", "cpu") for i in range(2)]
    runners = [ServiceRunner(info, functools.partial(EvaluationService, task, "cpu", cpus=[i], spare_cpus=[i],
                                                     **OPTIONS)) for i, info in enumerate(infos)]
    pool = LocalPool(list(zip(infos, runners)))
    try:
        # the service dies twice on the job (it restarts itself once): EvalServiceError, so the slot's service is
        # replaced and the job moves to the other slot
        killed = _killer(runners[0], pool, "cpu:0", 2)
        pool.submit(job("blocker", GOOD, slot="cpu:1"))
        events = drain_until(pool, lambda e: isinstance(e, JobStarted))
        pool.submit(job("moved", SEED))  # cpu:1 is busy: cpu:0 takes it
        events += drain(pool, 2)
        ends = {e.job.id: e for e in events if isinstance(e, (JobFinished, JobFailed))}
        assert isinstance(ends["moved"], JobFinished) and ends["moved"].result["verdict"] == "ok", events
        moved = [e for e in events if isinstance(e, JobRequeued)]
        assert len(killed) == 2 and [(e.job.id, e.slot.slot) for e in moved] == [("moved", "cpu:0")], events
        assert ends["moved"].result["measured_on"]["slot"] == "cpu:1"
        changed = [(e.slot.slot, e.state) for e in events if isinstance(e, SlotChanged)]
        assert changed == [("cpu:0", "faulted")]
        assert runners[0].replaced == 1 and runners[0].service is not None
        assert runners[0].service.health().pid not in killed  # a new service, on the same slot
        # the replaced service works; its next fault (the service recovers and re-runs the job itself) keeps the
        # result and retires the slot
        killed = _killer(runners[0], pool, "cpu:0", 1)
        pool.submit(job("second", SEED, slot="cpu:0"))
        events = drain(pool, 1)
        assert len(killed) == 1
        finished = [e for e in events if isinstance(e, JobFinished)]
        assert [(e.job.id, e.slot.slot, e.result["verdict"]) for e in finished] == [("second", "cpu:0", "ok")]
        assert finished[0].result["service"]["reruns"] == 1
        retired = [e for e in events if isinstance(e, SlotChanged)]
        assert [(e.slot.slot, e.state) for e in retired] == [("cpu:0", "retired")] and "died" in retired[0].message
        assert pool.reference() == "cpu:1"
        pool.submit(job("after", SEED))
        assert [e.slot.slot for e in drain(pool, 1) if isinstance(e, JobFinished)] == ["cpu:1"]
        assert runners[0].service is None  # retired: its processes are gone
    finally:
        pool.close()


def test_cancel_all_aborts_the_running_evaluation_and_close_leaves_no_process():
    task = load_task("softmax")
    pool = make_pool(task, "cpu", workers=1, service_options=OPTIONS)
    try:
        pool.submit(job("hang", LOOP))
        pool.submit(job("queued", SEED))
        deadline = time.monotonic() + 60
        while not pool.slots()[0].phase.startswith("forward"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        started = time.monotonic()
        pool.cancel_all()
        events = drain(pool, 2, timeout=20)
        assert time.monotonic() - started < 5  # not the 10 s the hang's step limit would take
        assert {e.job.id for e in events if isinstance(e, JobFailed) and e.cancelled} == {"hang", "queued"}
        assert not [e for e in events if isinstance(e, (JobFinished, SlotChanged))]  # no fault, no result
        pool.submit(job("next", SEED))
        assert [e.result["verdict"] for e in drain(pool, 1) if isinstance(e, JobFinished)] == ["ok"]
        assert descendants()
    finally:
        pool.close()
    deadline = time.monotonic() + 10
    while descendants() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert descendants() == set()


def test_a_gpu_slots_candidate_processes_see_its_gpu_alone():
    # The service process gets CUDA_VISIBLE_DEVICES from its gpu; the candidate processes are started by this
    # process, so they must get it too, or every slot's candidates would run on the first visible GPU. No GPU is
    # needed to see it: the waiting candidate process's environment says so.
    task = load_task("softmax")
    service = EvaluationService(task, "cuda", gpu="GPU-0000-fake", prepare_heldout=False)
    try:
        waiting = service._prestarter.waiting  # noqa: SLF001 - the pre-started process is what we inspect
        assert waiting is not None and waiting.proc is not None
        environ = Path(f"/proc/{waiting.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=GPU-0000-fake" in environ
    finally:
        service.close()
