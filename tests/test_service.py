"""The evaluation service on the CPU: one trusted process for many candidates, its caches, its limits, its faults.

The pure parts (seed pools, intervals, limits, the oracle cache, the channel's compile reports) are unit-tested;
the service itself runs for real (Triton interpreter), with broken tasks made in a temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from workbench.evaluator import (EvalCancelled, EvalServiceError, EvalUsageError, EvaluationService, isolation, limits,
                                 stats, wire)
from workbench.evaluator.channel import Channel, WorkerLost
from workbench.evaluator.oracle import OracleCache, Prepared
from workbench.evaluator.seeds import SLOT_MODULUS, SeedPool
from workbench.evaluator.selftest import CASES_DIR
from workbench.tasks import load_task

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "kernels" / "softmax" / "seed.py"
SEGFAULT = CASES_DIR / "softmax" / "segfault.py"
HANG = CASES_DIR / "softmax" / "infinite_loop.py"


# -- seeds ---------------------------------------------------------------------------------------------------------


def test_secret_seeds_differ_per_service_and_keep_their_slot():
    a, b = SeedPool(3), SeedPool(3)
    seeds_a, seeds_b = a.seeds("S1"), b.seeds("S1")
    assert seeds_a != seeds_b and seeds_a != [0, 1, 2]
    assert [s % SLOT_MODULUS for s in seeds_a] == [0, 1, 2], "slot i sees the input family seed i would"
    assert all(s % k == i % k for k in (2, 3, 4, 5, 7, 8) for i, s in enumerate(seeds_a))
    assert a.seeds("S1") == seeds_a and a.seeds("S2") != seeds_a, "a pool is stable, and per shape"
    assert max(seeds_a) < 2**40, "small enough for a make_inputs that scales its seed"
    fresh = {a.fresh("S1", 0) for _ in range(50)}
    assert len(fresh) == 50 and not fresh & set(seeds_a) and all(s % SLOT_MODULUS == 0 for s in fresh)


def test_fixed_seeds_are_reproducible():
    pool = SeedPool(3, secret=False)
    assert pool.seeds("S1") == [0, 1, 2]
    assert [pool.fresh("S1", 0), pool.fresh("S1", 1), pool.fresh("S2", 0)] == [3, 4, 3]
    pool.after_evaluation(8)
    assert pool.seeds("S1") == [0, 1, 2] and pool.retired == []


def test_pools_are_refreshed_one_slot_at_a_time():
    pool = SeedPool(3, refresh_every=2)
    first = pool.seeds("S1")
    pool.after_evaluation(1)
    assert pool.seeds("S1") == first
    pool.after_evaluation(2)
    second = pool.seeds("S1")
    assert second[1:] == first[1:] and second[0] != first[0] and second[0] % SLOT_MODULUS == 0
    assert pool.retired == [("S1", first[0])]
    pool.after_evaluation(4)
    assert pool.seeds("S1")[1] != first[1], "the next refresh replaces the next slot"


# -- precision, limits, cache --------------------------------------------------------------------------------------


def test_median_interval_covers_and_narrows():
    import random

    rng = random.Random(7)
    small = [rng.gauss(1.0, 0.05) for _ in range(30)]
    big = [rng.gauss(1.0, 0.05) for _ in range(600)]
    lo_s, hi_s = stats.median_ci(small)
    lo_b, hi_b = stats.median_ci(big)
    assert lo_s < 1.0 < hi_s and lo_b < 1.0 < hi_b
    assert hi_b - lo_b < (hi_s - lo_s) / 3, "twenty times the reps: a much narrower interval"
    assert stats.median_ci([5.0]) == (5.0, 5.0) and stats.median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)
    # The order statistics of n = 100 are the 40th and 61st values.
    assert stats.median_ci([float(i) for i in range(1, 101)]) == (40.0, 61.0)


def test_speedup_interval_and_geomean():
    base = [2.0 + 0.01 * (i % 7) for i in range(200)]
    cand = [1.0 + 0.005 * (i % 5) for i in range(200)]
    ci = stats.ratio_ci(base, cand)
    assert ci.low <= ci.speedup <= ci.high and 1.9 < ci.speedup < 2.1
    assert 0 < ci.rel_halfwidth < 0.02
    both = stats.geomean_ci([ci, stats.RatioCI(8.0, 7.0, 9.0)])
    assert both.speedup == pytest.approx(4.0, rel=0.02) and both.low < both.speedup < both.high
    assert stats.geomean_ci([ci, stats.RatioCI(float("nan"), 1.0, 2.0)]) is None


def test_stop_rule_waits_for_precision_within_bounds():
    rule = stats.StopRule(target=0.01, min_reps=40, min_blocks=4, max_reps=600, max_side_ms=1000.0, max_wall_s=1.0)
    steady = [1.0] * 40
    assert not rule.done(steady[:20], steady[:20], 2), "too few reps and blocks"
    assert not rule.done(steady, steady, 3), "too few blocks"
    assert rule.done(steady, steady, 4)
    noisy = [1.0 + (0.3 if i % 2 else -0.3) for i in range(40)]
    assert not rule.done(noisy, noisy, 5), "a wide interval keeps timing"
    assert rule.done(noisy * 15, noisy * 15, 60), "until the rep ceiling"
    assert rule.done([600.0, 500.0], [1.0, 1.0], 1), "or the time ceiling"
    assert rule.done(noisy, noisy, 5, wall_s=1.5) and not rule.done(noisy, noisy, 5, wall_s=0.5), "or wall time"
    assert not rule.done(noisy[:4], noisy[:4], 1, wall_s=9.0), "but never before the floor of reps and blocks"


def test_precompile_processes_split_the_configs_between_them():
    from workbench.evaluator.precompile import _CompileOnly

    launched: list[tuple[int, int]] = []
    shares = [_CompileOnly(i, 3) for i in range(3)]
    for i, bench in enumerate(shares):
        for config in range(7):
            got = bench(lambda i=i, config=config: launched.append((i, config)), quantiles=(0.5, 0.2, 0.8))
            assert got == ([1.0] * 3 if config % 3 == i else [float("inf")] * 3)
    assert sorted(c for _, c in launched) == list(range(7)), "every config compiled exactly once among them"


def test_limits_follow_the_baseline_with_a_floor():
    assert limits.call_limit(None, "cuda") == limits.FLOOR_S["cuda"]
    assert limits.call_limit(0.5, "cuda") == limits.FLOOR_S["cuda"], "a fast baseline gets the floor"
    assert limits.call_limit(400.0, "cuda") == pytest.approx(limits.CALL_FACTOR * 0.4)
    assert limits.call_limit(400.0, "cpu") == limits.FLOOR_S["cpu"], "the interpreter has no peer to scale from"
    assert limits.block_limit(10, 2.0, "cuda") == pytest.approx(limits.FLOOR_S["cuda"] + limits.BLOCK_FACTOR * 0.02)
    shapes = [limits.shape_limits(1.0, "cuda", 4, 20_000.0)] * 3
    assert limits.evaluation_limit(shapes, "cuda") > 3 * 4 * limits.FLOOR_S["cuda"]


def _prepared(nbytes: int) -> Prepared:
    return Prepared(seed=0, expected=[], dtypes=[], fingerprint={}, nbytes=nbytes)


def test_oracle_cache_is_an_lru_bounded_in_bytes():
    cache = OracleCache(100)
    for seed in range(3):
        cache.put(("h", "S1", seed), _prepared(40))
    assert ("h", "S1", 0) not in cache and cache.stats.evictions == 1 and cache.stats.bytes == 80
    assert cache.get(("h", "S1", 1)) is not None  # now the most recent
    cache.put(("h", "S2", 0), _prepared(40))
    assert ("h", "S1", 2) not in cache and ("h", "S1", 1) in cache
    assert cache.get(("other", "S1", 1)) is None and (cache.stats.hits, cache.stats.misses) == (1, 1)
    cache.put(("h", "huge", 0), _prepared(1000))
    assert ("h", "huge", 0) not in cache, "an entry above the whole budget is not kept"
    cache.clear()
    assert cache.stats.bytes == 0 and cache.stats.entries == 0


# -- the channel: compile reports ----------------------------------------------------------------------------------


def _messages(fd: int) -> list[dict]:
    reader = wire.FrameReader(1 << 20)
    os.set_blocking(fd, False)
    out = []
    try:
        while True:
            data = os.read(fd, 1 << 16)
            if not data:
                break
            out += [json.loads(f) for f in reader.feed(data)]
    except BlockingIOError:
        pass
    return out


def test_a_compile_report_switches_the_step_to_the_compile_limit_and_back():
    parent_r, parent_w = os.pipe()
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    channel = Channel(parent_w)
    channel.attach(to_w, from_r)

    def worker() -> None:
        wire.read_frame(to_r, 1 << 20)
        for msg in ({"event": "compile", "phase": "start", "kernel": "_k"},
                    {"event": "compile", "phase": "end", "kernel": "_k"}, {"ok": True, "value": 7}):
            wire.write_frame(from_w, wire.dump_json(msg))
            time.sleep(0.05)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        reply = channel.ask({"op": "run"}, "forward", 5.0, shape="S1", seed=0)
    finally:
        thread.join()
    assert reply == {"ok": True, "value": 7}
    stages = [(m["stage"], m["budget_s"], m["trusted"]) for m in _messages(parent_r) if m["type"] == "stage"]
    assert stages == [("forward", 5.0, False), ("compile", limits.COMPILE_S, False), ("forward", 5.0, False)]
    assert channel.compiles[0]["kernel"] == "_k" and channel.compiles[0]["s"] >= 0.04
    # A frame that is not a status reply is the other side misbehaving.
    wire.write_frame(from_w, wire.dump_json({"hello": 1}))
    with pytest.raises(WorkerLost, match="not a status dict"):
        channel.ask({"op": "run"}, "forward", 5.0)
    os.close(from_w)
    with pytest.raises(WorkerLost, match="closed its pipe"):
        channel.ask({"op": "run"}, "forward", 5.0)
    for fd in (parent_r, parent_w, to_r, to_w, from_r):
        os.close(fd)


# -- isolation -----------------------------------------------------------------------------------------------------


def test_candidate_environment_is_an_allowlist_without_credentials(monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "TORCH_HUB_TOKEN",
                 "MY_SERVICE_PASSWORD", "SOME_RANDOM_SETTING"):
        monkeypatch.setenv(name, "x")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    env = isolation.candidate_env("cuda")
    for name in ("ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "TORCH_HUB_TOKEN",
                 "MY_SERVICE_PASSWORD", "SOME_RANDOM_SETTING"):
        assert name not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["NCCL_NVLS_ENABLE"] == "0" and "PATH" in env
    assert env["PYTHONPATH"].split(os.pathsep)[0] == isolation.checkout_root()
    assert env["TRITON_CACHE_DIR"].endswith(isolation.CANDIDATE_CACHE)
    cpu = isolation.candidate_env("cpu")
    assert cpu["TRITON_INTERPRET"] == "1" and cpu["CUDA_VISIBLE_DEVICES"] == ""
    trusted = isolation.trusted_env()
    assert "SOME_RANDOM_SETTING" in trusted and "HF_TOKEN" not in trusted and "ANTHROPIC_API_KEY" not in trusted


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads a process's environment from /proc")
def test_a_candidate_process_holds_no_secrets_and_no_network(monkeypatch):
    from workbench.evaluator.prestart import WorkerProcess

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-secret")
    worker = WorkerProcess("cpu", netns=True)
    try:
        worker.warm()
        ready = json.loads(wire.read_frame(worker.service_fds[1], 1 << 20))
        environ = Path(f"/proc/{worker.pid}/environ").read_bytes()
        assert b"sk-secret" not in environ and b"ANTHROPIC" not in environ
        on, detail = isolation.probe_network_namespace()
        assert ready["netns"] is on
        if on:
            assert os.readlink(f"/proc/{worker.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        else:  # off only for a reason the machine gives, which doctor prints
            assert detail.startswith(("unshare refused", "switched off", "not Linux")), detail
    finally:
        worker.discard()


# -- the service, for real -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def softmax():
    return load_task("softmax")


def test_one_service_serves_many_candidates_and_computes_the_oracle_once(small):
    with EvaluationService(small, "cpu", prepare_heldout=False) as service:
        first = service.evaluate(SEED)
        second = service.evaluate(SEED)
        crash = service.evaluate(SEGFAULT)
        third = service.evaluate(SEED)
        health = service.health()
    pool = len(small.shapes["cpu"]) * 3
    assert first["verdict"] == second["verdict"] == third["verdict"] == "ok", first["message"]
    assert first["cache"]["hits"] + first["cache"]["misses"] == pool
    assert second["cache"] == {**second["cache"], "hits": pool, "misses": 0}, "the pool's oracle outputs are kept"
    assert crash["verdict"] == "crash" and "SIGSEGV" in crash["message"]
    assert first["service"]["pid"] == third["service"]["pid"], "a candidate's crash does not touch the service"
    assert health.evaluations == 4 and health.restarts == 0 and health.faults == [] and health.alive
    assert first["seeding"] == {"secret": True, "pool": 3, "fresh_sets": 2, "refresh_every": 8}
    assert first["limits"]["shapes"]["C2"]["call_s"] == limits.FLOOR_S["cpu"]
    for shape in first["shapes"]:
        assert shape["seeds_checked"] == 3 and shape["spot_checks"] >= 1 and shape["revalidated"]


def test_a_service_that_dies_mid_evaluation_is_restarted_and_the_evaluation_run_once_more(small):
    with EvaluationService(small, "cpu", prepare_heldout=False) as service:
        killed: list[int] = []

        def kill_once(stage: dict) -> None:
            if stage["stage"] == "timing" and not killed:
                killed.append(service.health().pid)
                os.kill(killed[0], signal.SIGKILL)

        result = service.evaluate(SEED, on_stage=kill_once)
        health = service.health()
    assert result["verdict"] == "ok", result["message"]
    assert health.restarts == 1 and [f.kind for f in health.faults] == ["died"]
    assert "died while timing forward" in health.faults[0].message
    assert result["service"]["reruns"] == 1 and result["service"]["pid"] != killed[0]


def test_a_service_that_dies_twice_is_a_clear_error(small):
    with EvaluationService(small, "cpu", prepare_heldout=False) as service:
        def kill(stage: dict) -> None:
            if stage["stage"] == "forward":
                os.kill(service.health().pid, signal.SIGKILL)

        with pytest.raises(EvalServiceError, match=r"failed twice on seed.py: died: .* then died"):
            service.evaluate(SEED, on_stage=kill)
        assert service.evaluate(SEED)["verdict"] == "ok", "and the next evaluation starts a sound service"


def test_cancel_aborts_the_evaluation_in_progress_at_once_and_the_service_carries_on(small):
    with EvaluationService(small, "cpu", prepare_heldout=False) as service:
        assert service.cancel() is False, "nothing to abort between evaluations"
        service.evaluate(SEED)  # warm: the oracle outputs are cached, so the hang is reached at once
        candidate = service._prestarter.waiting
        timer: list[threading.Timer] = []
        cancelled_at: list[float] = []

        def cancel() -> None:
            cancelled_at.append(time.monotonic())
            assert service.cancel() is True

        def on_stage(stage: dict) -> None:
            if stage["stage"] == "forward" and not timer:  # the candidate's first call, which never returns
                timer.append(threading.Timer(0.5, cancel))
                timer[0].start()

        with pytest.raises(EvalCancelled, match=r"infinite_loop.py: evaluation aborted after .* while running forward"):
            service.evaluate(HANG, on_stage=on_stage)
        took = time.monotonic() - cancelled_at[0]
        assert took < 1.0, f"the abort took {took:.2f} s"
        assert candidate.proc.poll() is not None, "the candidate process is gone"
        after = service.evaluate(SEED)
        health = service.health()
    assert after["verdict"] == "ok", after["message"]
    assert health.restarts == 0 and health.faults == [], "the service let go of the killed candidate and carried on"


def _task_copy(tmp_path: Path, name: str, reference: str | None = None, baseline: str | None = None):
    """softmax with two interpreter shapes (C2, C3: odd sizes, one row longer than a block), under another name,
    its reference or baseline extended with the given source."""
    folder = tmp_path / name
    shutil.copytree(ROOT / "kernels" / "softmax", folder)
    text = (folder / "task.toml").read_text().replace('name = "softmax"', f'name = "{name}"')
    head, *cpu = text.split("[[shapes.cpu]]")
    tail = cpu[-1][cpu[-1].index("[[shapes.heldout]]"):]
    kept = [block for block in cpu if 'name = "C2"' in block or 'name = "C3"' in block]
    kept[-1] = kept[-1].split("[[shapes.heldout]]")[0]
    (folder / "task.toml").write_text(head + "".join("[[shapes.cpu]]" + b for b in kept) + tail)
    if reference is not None:
        (folder / "reference.py").write_text((folder / "reference.py").read_text() + reference)
    if baseline is not None:
        (folder / "baseline.py").write_text((folder / "baseline.py").read_text() + baseline)
    task = load_task(name, tmp_path)
    assert [s.name for s in task.shapes["cpu"]] == ["C2", "C3"]
    return task


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return _task_copy(tmp_path_factory.mktemp("tasks"), "small")


def test_a_baseline_that_fails_on_a_shape_is_a_service_error(tmp_path):
    task = _task_copy(tmp_path, "brokenbase", baseline=(
        "\n\ndef forward(x):\n    raise RuntimeError('autotuning found no config that fits (out of resources)')\n"))
    with EvaluationService(task, "cpu", prepare_heldout=False) as service:
        with pytest.raises(EvalServiceError, match=r"baseline torch.softmax failed on shape C2: RuntimeError: "
                                                   r"autotuning found no config"):
            service.evaluate(SEED)
        kinds = [f.kind for f in service.health().faults]
        assert len(kinds) >= 2 and set(kinds) == {"baseline"}


def test_a_baseline_that_fails_to_import_is_a_usage_error(tmp_path):
    task = _task_copy(tmp_path, "noimport", baseline="\nraise ImportError('no module named fla')\n")
    with EvaluationService(task, "cpu", prepare_heldout=False) as service:
        with pytest.raises(EvalUsageError, match="the task's reference or baseline failed to import: ImportError"):
            service.evaluate(SEED)


def test_an_oracle_out_of_memory_frees_the_cache_and_tries_again(tmp_path):
    marker = tmp_path / "oom-raised"
    task = _task_copy(tmp_path, "oomonce", reference=(
        "\n\n_plain = forward\n_raised = []\n\n\ndef forward(x):\n"
        "    if not _raised:\n"
        f"        _raised.append(1)\n        open({str(marker)!r}, 'w').close()\n"
        "        raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')\n"
        "    return _plain(x)\n"))
    with EvaluationService(task, "cpu", prepare_heldout=False) as service:
        result = service.evaluate(SEED)
        assert result["verdict"] == "ok" and marker.exists() and service.health().faults == []


def test_an_oracle_always_out_of_memory_is_a_service_error(tmp_path):
    task = _task_copy(tmp_path, "oomalways", reference=(
        "\n\ndef forward(x):\n    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 20.00 GiB')\n"))
    with EvaluationService(task, "cpu", prepare_heldout=False) as service:
        with pytest.raises(EvalServiceError, match="oracle: the oracle ran out of memory on shape C2"):
            service.evaluate(SEED)


def test_a_changed_reference_restarts_the_service_with_empty_caches(tmp_path):
    task = _task_copy(tmp_path, "edited")
    with EvaluationService(task, "cpu", prepare_heldout=False) as service:
        first = service.evaluate(SEED)
        (task.reference).write_text(task.reference.read_text() + "\n# edited\n")
        second = service.evaluate(SEED)
    assert first["verdict"] == second["verdict"] == "ok"
    # A new process: its oracle cache starts empty (it lives in the process), whatever it prepared since.
    assert second["service"]["restarts"] == 1 and second["service"]["pid"] != first["service"]["pid"]


def test_bad_arguments_are_usage_errors(softmax, tmp_path):
    with pytest.raises(EvalUsageError, match="unknown device"):
        EvaluationService(softmax, "tpu")
    with pytest.raises(EvalUsageError, match="fresh_sets"):
        EvaluationService(softmax, "cpu", fresh_sets=1)
    with EvaluationService(softmax, "cpu", prestart=False) as service:
        with pytest.raises(EvalUsageError, match="candidate file not found"):
            service.evaluate(tmp_path / "nope.py")
        with pytest.raises(EvalUsageError, match="timeout_s"):
            service.evaluate(SEED, timeout_s=0)
    with pytest.raises(EvalUsageError, match="closed"):
        service.evaluate(SEED)
