"""Pre-started candidate processes: ready before they are configured, used once, never shared, cleaned up."""

import os
from pathlib import Path

import pytest
from waiting import wait_until

from workbench.evaluator import EvaluationService, wire
from workbench.evaluator.prestart import Prestarter, WorkerProcess
from workbench.tasks import load_task

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "kernels" / "softmax" / "seed.py"


def _has_torch_loaded(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc to see what a process loaded")
def test_worker_says_ready_after_importing_torch_and_exits_unused():
    worker = WorkerProcess("cpu")
    try:
        to_worker, from_worker = worker.service_fds
        assert wait_until(lambda: _has_torch_loaded(worker.pid), 60), "it imports before it is told anything"
        worker.warm()
        ready = wire.read_frame(from_worker, 1 << 20)  # after the warm-up it was told to do
        assert b'"ready": true' in ready and _has_torch_loaded(worker.pid)
        assert b'"netns": true' in ready or b'"netns": false' in ready
        # Closing stdin unsent is how an owner lets an unused worker go: it exits on its own, status 0.
        worker.proc.stdin.close()
        assert wait_until(lambda: worker.proc.poll() is not None, 30)
        assert worker.proc.returncode == 0
    finally:
        worker.discard()
    assert not worker.tmp.exists() and worker.service_fds is None


def test_evaluations_take_a_fresh_prestarted_worker_each_time():
    with EvaluationService(load_task("softmax"), "cpu", prepare_heldout=False) as service:
        waiting = service._prestarter.waiting
        first_pid = waiting.pid
        first = service.evaluate(SEED)
        assert first["verdict"] == "ok", first["message"]
        assert first["prestarted"] is True  # started with the service, while nobody needed it yet
        nxt = service._prestarter.waiting
        assert nxt is not None and nxt.pid != first_pid and _gone(first_pid) and not waiting.tmp.exists()
        second = service.evaluate(SEED)
        assert second["verdict"] == "ok" and second["prestarted"] is True
        assert service.health().prestarted == 2 and _gone(nxt.pid)
        assert first["service"]["pid"] == second["service"]["pid"], "one service process serves both"
        last = service._prestarter.waiting
    assert last is not None and not last.alive() and not last.tmp.exists()


def test_a_worker_that_died_while_waiting_is_replaced_by_a_cold_start():
    with EvaluationService(load_task("softmax"), "cpu", prepare_heldout=False) as service:
        dead = service._prestarter.waiting
        dead.proc.kill()
        dead.proc.wait()
        result = service.evaluate(SEED)
        assert result["verdict"] == "ok", result["message"]
        assert result["prestarted"] is False and service.health().prestarted == 0
        assert not dead.tmp.exists()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_a_waiting_worker_keeps_off_the_timing_cpus():
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 3:
        pytest.skip("needs three CPUs: two for timing, one for a waiting worker")
    pool = Prestarter("cpu", cpus=set(allowed[2:]))
    try:
        pool.replenish()
        assert os.sched_getaffinity(pool.waiting.pid) == set(allowed[2:])
    finally:
        pool.close()
