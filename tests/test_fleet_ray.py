"""Evaluation slots on a real local Ray of two CPU workers (Triton interpreter), started once for this module:
results come back from the actors with where they were measured, a worker killed mid-evaluation has its job moved
to the other slot (none lost, none finished twice) and its processes go with it; Ray missing or an address that
does not answer are one-line errors."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
import ray  # in the dev extra: CI runs these tests, it does not skip them

from workbench.fleet import cluster
from workbench.fleet.api import EvalJob, FleetError, JobFailed, JobFinished, JobRequeued, JobStarted, SlotChanged
from workbench.fleet.factory import make_pool, preflight
from workbench.tasks import load_task

from fleet_jobs import drain, job

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "kernels" / "softmax" / "seed.py"
OPTIONS = {"prepare_heldout": False, "secret_seeds": False}
SLOW_FIRST_CALL = """

_fast_forward = forward
_first = [True]


def forward(x):
    # about 1 s of Python on this process's first call (the harness refuses `import time`): the test's poll of the
    # actor's phase, every cluster.PHASE_POLL_S, sees this evaluation mid-step however fast the rest of it is
    if _first[0]:
        _first[0] = False
        n = 0
        for _ in range(25_000_000):
            n += 1
    return _fast_forward(x)
"""

pytestmark = pytest.mark.slow
# No step here can hang CI: every wait below has a deadline, the pool's Ray calls have timeouts of their own
# (cluster.START_TIMEOUT_S, the close's 30 s), and pool.close() kills the actors.


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray of two CPUs for the whole module (its start takes seconds)."""
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_ray_workers_evaluate_from_source_and_a_killed_worker_loses_no_job(local_ray, tmp_path):
    task = load_task("softmax")
    pool = make_pool(task, "cpu", workers=2, cluster="ray", service_options=OPTIONS)
    try:
        host = socket.gethostname()
        names = [s.info.slot for s in pool.slots()]
        assert names == [f"ray:{host}:cpu:0", f"ray:{host}:cpu:1"] and pool.reference() == names[0]
        # the source travels: this path does not exist anywhere
        pool.submit(EvalJob("a", 1, tmp_path / "gone" / "kernel.py", SEED.read_text()))
        pool.submit(job("b", SEED))
        events = drain(pool, 2)
        done = {e.job.id: e for e in events if isinstance(e, JobFinished)}
        assert {k: e.result["verdict"] for k, e in done.items()} == {"a": "ok", "b": "ok"}
        assert {e.slot.slot for e in events if isinstance(e, JobStarted)} == set(names)
        assert all(e.result["measured_on"]["slot"] == e.slot.slot and e.result["measured_on"]["host"] == host
                   for e in done.values())

        # kill one worker's process mid-evaluation: its job moves to the other worker, once
        victim = names[0]
        actor = pool.runner(victim).actor  # type: ignore[attr-defined]
        actor_pid = ray.get(actor.describe.remote(), timeout=30)["pid"]
        service_pid = ray.get(actor.service_pid.remote(), timeout=30)
        pool.submit(job("blocker", SEED, slot=names[1]))
        slow = tmp_path / "slow_first_call.py"
        slow.write_text(SEED.read_text() + SLOW_FIRST_CALL)
        pool.submit(job("victim", slow))
        deadline = time.monotonic() + 60
        while not next(s for s in pool.slots() if s.info.slot == victim).phase.startswith("forward"):
            assert time.monotonic() < deadline, pool.slots()
            time.sleep(0.05)
        os.kill(actor_pid, signal.SIGKILL)
        events = drain(pool, 2)
        ends = [e for e in events if isinstance(e, (JobFinished, JobFailed))]
        assert sorted(e.job.id for e in ends) == ["blocker", "victim"]  # one end each: none lost, none twice
        victim_end = next(e for e in ends if e.job.id == "victim")
        assert isinstance(victim_end, JobFinished) and victim_end.slot.slot == names[1]
        assert victim_end.result["verdict"] == "ok"
        assert [(e.job.id, e.slot.slot) for e in events if isinstance(e, JobRequeued)] == [("victim", victim)]
        assert [(e.job.id, e.slot.slot) for e in events if isinstance(e, JobStarted) and e.job.id == "victim"] == [
            ("victim", victim), ("victim", names[1])]
        retired = [e for e in events if isinstance(e, SlotChanged)]
        assert [(e.slot.slot, e.state) for e in retired] == [(victim, "retired")]
        assert "Ray actor was lost" in retired[0].message
        assert pool.reference() == names[1]
        deadline = time.monotonic() + 20
        while service_pid and alive(service_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not (service_pid and alive(service_pid)), "the killed worker's service outlived it"
    finally:
        pool.close()


def test_more_ray_workers_than_cpus_is_one_line(local_ray):
    with pytest.raises(FleetError, match="the Ray cluster has 2 CPUs"):
        make_pool(load_task("softmax"), "cpu", workers=3, cluster="ray")
    with pytest.raises(FleetError, match="has no GPU"):
        make_pool(load_task("softmax"), "cuda", cluster="ray")


def test_a_ray_address_that_does_not_answer_fails_fast_in_one_line(monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(FleetError) as err:
        preflight("cpu", cluster="ray")
    assert time.monotonic() - started < cluster.CONNECT_TIMEOUT_S + 1
    assert f"the Ray cluster at 127.0.0.1:{port} does not answer" in str(err.value)
    assert "\n" not in str(err.value)
    monkeypatch.setenv("RAY_ADDRESS", "not an address")
    with pytest.raises(FleetError, match="is not host:port"):
        preflight("cpu", cluster="ray")


def test_ray_not_installed_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(FleetError) as err:
        preflight("cpu", cluster="ray")
    assert str(err.value) == "--cluster ray needs Ray, which is not installed here: pip install -e '.[cluster]'"
