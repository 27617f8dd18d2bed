"""Pre-started evaluator pairs: used once, never shared, cleaned up, and transparent to the verdict."""

import os
import time
from pathlib import Path

import pytest

from workbench.evaluator import evaluate
from workbench.evaluator.prestart import Pair, Prestarter
from workbench.tasks import load_task

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "kernels" / "softmax" / "seed.py"


def _has_torch_loaded(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _wait_for(pred, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc to see what a process loaded")
def test_pair_imports_torch_before_it_is_configured_and_exits_unused():
    pair = Pair("cpu")
    try:
        assert _wait_for(lambda: _has_torch_loaded(pair.worker.pid) and _has_torch_loaded(pair.harness.pid), 60)
        assert pair.alive()
        # Closing stdin unsent is how an owner lets an unused pair go: both exit on their own, status 0.
        for proc in pair.procs:
            proc.stdin.close()
        assert _wait_for(lambda: all(p.poll() is not None for p in pair.procs), 30)
        assert [p.returncode for p in pair.procs] == [0, 0]
    finally:
        pair.discard()
    assert not pair.tmp.exists()


def test_evaluations_take_a_fresh_prestarted_pair_each_time():
    task = load_task("softmax")
    with Prestarter() as pool:
        first = evaluate(task, SEED, device="cpu", prestarter=pool)
        assert first["verdict"] == "ok", first["message"]
        assert first["prestarted"] is False  # nothing was ready yet
        ready = pool._ready["cpu"]  # started once the first evaluation's processes were gone
        pids = {p.pid for p in ready.procs}
        second = evaluate(task, SEED, device="cpu", prestarter=pool)
        assert second["verdict"] == "ok", second["message"]
        assert second["prestarted"] is True and pool.hits == 1
        # The pair that served the second evaluation is gone, and a different one waits for the third.
        assert all(not os.path.exists(f"/proc/{pid}") or _zombie(pid) for pid in pids)
        assert not ready.tmp.exists()
        assert {p.pid for p in pool._ready["cpu"].procs}.isdisjoint(pids)
        waiting = pool._ready["cpu"]
    assert not waiting.alive() and not waiting.tmp.exists()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_a_pair_that_died_while_waiting_is_replaced_by_a_cold_start(tmp_path):
    task = load_task("softmax")
    with Prestarter() as pool:
        pool.replenish("cpu")
        dead = pool._ready["cpu"]
        for proc in dead.procs:
            proc.kill()
            proc.wait()
        result = evaluate(task, SEED, device="cpu", prestarter=pool)
        assert result["verdict"] == "ok", result["message"]
        assert result["prestarted"] is False and pool.hits == 0
        assert not dead.tmp.exists()
