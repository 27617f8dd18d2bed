"""The evaluator on the CPU interpreter: known-good and known-bad candidates, guards, framing, verdicts, report."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.evaluator import VERDICTS, EvalUsageError, evaluate, format_result
from workbench.evaluator import device as devices
from workbench.evaluator import verdict as verdicts
from workbench.evaluator import wire
from workbench.evaluator.diagnose import classify
from workbench.evaluator.guards import check_static, forbidden_modules
from workbench.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
CASES = REPO / "tests" / "evaluator_cases" / "softmax"
SEED = REPO / "kernels" / "softmax" / "seed.py"
CONTRACT_KEYS = {"task", "file", "sha256", "device", "verdict", "message", "shapes", "speedup", "timing_comparable"}
SHAPE_KEYS = {"name", "correct", "rel_err", "ms", "baseline_ms", "speedup", "floor_ms"}

# Every process-level case, evaluated once per test session and concurrently (each spends most of its time
# importing torch in two fresh processes). The hang case runs on its own: its deadline must not be eaten by
# a CPU shared with the others.
POOLED = [
    "seed", "seed_heldout", "good_simple", "no_max", "off_by_one", "zeros", "nan_out", "uninit_empty", "segfault",
    "wrong_shape", "wrong_dtype", "mutate_input", "tensor_subclass", "patch_timer", "triton_compile_error",
    "raises", "no_entry",
]


@pytest.fixture(scope="module")
def task():
    return load_task("softmax")


@pytest.fixture(scope="module")
def results(task):
    def run(name):
        if name == "seed":
            return evaluate(task, SEED, device="cpu")
        if name == "seed_heldout":
            return evaluate(task, SEED, device="cpu", heldout=True)
        return evaluate(task, CASES / f"{name}.py", device="cpu")

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(POOLED, pool.map(run, POOLED)))


def assert_contract(result):
    assert CONTRACT_KEYS <= set(result)
    assert result["verdict"] in VERDICTS
    assert "\n" not in result["message"] and result["message"]
    json.dumps(result, allow_nan=False)  # strict JSON: no NaN/inf anywhere
    for shape in result["shapes"]:
        assert SHAPE_KEYS <= set(shape)


# -- end to end on the interpreter ---------------------------------------------------------------------------------


def test_seed_is_ok(results, task):
    result = results["seed"]
    assert_contract(result)
    assert result["verdict"] == "ok", result["message"]
    assert result["device"] == "cpu-interpret" and result["timing_comparable"] is False
    assert result["sha256"] == hashlib.sha256(SEED.read_bytes()).hexdigest()
    assert [s["name"] for s in result["shapes"]] == [s.name for s in task.shapes["cpu"]]
    for shape in result["shapes"]:
        assert shape["correct"] is True and shape["seeds_checked"] == 3
        assert 0 <= shape["rel_err"] <= task.tol("y")
        assert shape["ms"] > 0 and shape["baseline_ms"] > 0 and shape["speedup"] > 0
        assert shape["floor_ms"] is None
    assert result["speedup"] > 0 and result["baseline"] == "torch.softmax"
    assert "heldout" not in result
    assert result["env"]["interpreter"] is True
    assert result["elapsed_s"] < 120


def test_seed_heldout(results, task):
    result = results["seed_heldout"]
    assert result["verdict"] == "ok", result["message"]
    assert [s["name"] for s in result["heldout"]] == [s.name for s in task.shapes["heldout_cpu"]]
    assert all(s["correct"] for s in result["heldout"])
    assert [s["name"] for s in result["shapes"]] == [s.name for s in task.shapes["cpu"]]


def test_simple_kernel_is_ok(results):
    assert results["good_simple"]["verdict"] == "ok", results["good_simple"]["message"]


@pytest.mark.parametrize(
    "case,fragment",
    [
        ("no_max", "shape C1, seed 1: output y has 1 NaN/inf"),
        ("off_by_one", "incorrect on shape C"),
        ("zeros", "shape C1, seed 0: output y rel_rms 1 > tol 1e-05"),
        ("nan_out", "NaN/inf"),
        ("uninit_empty", "shape C1, seed 0"),
        ("wrong_shape", "output y has shape (1, 1, 1), expected (1, 1)"),
        ("wrong_dtype", "output y has dtype float64, expected float32"),
        ("mutate_input", "forward modified its input(s) x in place"),
        ("tensor_subclass", "expected exactly torch.Tensor"),
    ],
)
def test_incorrect_cases(results, case, fragment):
    result = results[case]
    assert_contract(result)
    assert result["verdict"] == "incorrect", result["message"]
    assert fragment in result["message"]
    assert result["speedup"] is None
    assert any(s["correct"] is False and s["problem"] for s in result["shapes"])


def test_off_by_one_fails_every_shape_with_an_error(results):
    shapes = results["off_by_one"]["shapes"]
    assert all(s["correct"] is False for s in shapes)
    assert all(s["rel_err"] is None or s["rel_err"] > 1e-5 for s in shapes)
    assert any(s["rel_err"] and s["rel_err"] > 1e-3 for s in shapes)


def test_segfault_is_crash(results):
    result = results["segfault"]
    assert result["verdict"] == "crash"
    assert "SIGSEGV" in result["message"]
    assert f"{CASES / 'segfault.py'}:7" in result["message"]
    assert "shape C1, seed 0" in result["message"]


def test_exception_is_crash_with_line(results):
    result = results["raises"]
    assert result["verdict"] == "crash"
    assert f"{CASES / 'raises.py'}:6: RuntimeError: kernel launch failed on purpose" in result["message"]


def test_triton_compile_error_names_kernel_line(results):
    result = results["triton_compile_error"]
    assert result["verdict"] == "compile_error"
    assert f"{CASES / 'triton_compile_error.py'}:10:" in result["message"]
    assert "power of 2" in result["message"]


def test_missing_entry_is_compile_error(results):
    result = results["no_entry"]
    assert result["verdict"] == "compile_error" and "defines no callable forward()" in result["message"]


def test_timer_patch_is_forbidden(results):
    result = results["patch_timer"]
    assert result["verdict"] == "forbidden" and "time.perf_counter" in result["message"]


def test_infinite_loop_times_out(task):
    result = evaluate(task, CASES / "infinite_loop.py", device="cpu", timeout_s=10)
    assert_contract(result)
    assert result["verdict"] == "timeout"
    assert "running forward on shape C1, seed 0" in result["message"]
    assert result["elapsed_s"] < 30


def test_syntax_error_is_compile_error_without_processes(task):
    result = evaluate(task, CASES / "syntax_error.py", device="cpu")
    assert_contract(result)
    assert result["verdict"] == "compile_error"
    assert result["message"].startswith(f"{CASES / 'syntax_error.py'}:5: SyntaxError")
    assert result["elapsed_s"] < 2


def test_forbidden_import_names_line(task):
    result = evaluate(task, CASES / "forbidden_import.py", device="cpu")
    assert result["verdict"] == "forbidden"
    assert result["message"].startswith(f"{CASES / 'forbidden_import.py'}:5: import of 'flash_attn'")
    assert result["findings"][0]["line"] == 5


def test_forbidden_torch_op_names_line(task):
    result = evaluate(task, CASES / "torch_softmax.py", device="cpu")
    assert result["verdict"] == "forbidden"
    assert f"{CASES / 'torch_softmax.py'}:7: torch.nn.functional.softmax" in result["message"]


def test_missing_file_is_usage_error(task, tmp_path):
    with pytest.raises(EvalUsageError, match="candidate file not found"):
        evaluate(task, tmp_path / "nope.py", device="cpu")
    with pytest.raises(EvalUsageError, match="unknown device"):
        evaluate(task, SEED, device="tpu")
    with pytest.raises(EvalUsageError, match="seeds"):
        evaluate(task, SEED, device="cpu", seeds=0)


def test_calling_process_never_imports_torch():
    code = (
        "import sys; import workbench.evaluator, workbench.tasks; "
        "bad = [m for m in ('torch', 'triton', 'numpy', 'textual', 'rich') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_format_result(results):
    text = format_result(results["seed"])
    assert "verdict: ok" in text and "C3" in text and "torch.softmax" in text and "not comparable" in text
    text = format_result(results["no_max"])
    assert "verdict: incorrect" in text and "C1: seed 1" in text


# -- static guards -------------------------------------------------------------------------------------------------


def findings(task, source):
    return [(f.rule, f.line) for f in check_static(task, source)]


def test_static_guard_imports(task):
    src = (
        "import torch\n"
        "from flash_attn.ops import x\n"
        "import fla.layers as L\n"
        "m = __import__('xformers')\n"
        "import importlib\n"
        "n = importlib.import_module('flashinfer')\n"
        "import flask\n"
    )
    assert findings(task, src) == [
        ("forbidden-import", 2), ("forbidden-import", 3), ("forbidden-import", 4), ("forbidden-import", 6),
    ]


def test_static_guard_torch_ops(task):
    src = (
        "import torch\n"
        "import math\n"
        "import triton\n"
        "import triton.language as tl\n"
        "from torch import exp\n"
        "@triton.jit\n"
        "def k(p):\n"
        "    v = tl.exp(tl.load(p))\n"
        "    w = v.exp()\n"
        "def f(x):\n"
        "    a = math.exp(1.0)\n"
        "    b = x.softmax(-1)\n"
        "    c = torch.special.exp2(x)\n"
        "    d = torch.Tensor.exp\n"
        "    return torch.empty_like(x)\n"
    )
    assert findings(task, src) == [
        ("forbidden-torch-op", 5), ("forbidden-torch-op", 12), ("forbidden-torch-op", 13), ("forbidden-torch-op", 14),
    ]


def test_static_guard_passes_seed(task):
    assert check_static(task, SEED.read_text()) == []


def test_runtime_module_guard():
    assert forbidden_modules(["torch", "fla.layers", "flask", "flash_attn"], ["fla", "flash_attn"]) == [
        "fla", "flash_attn"]


# -- pieces --------------------------------------------------------------------------------------------------------


def test_auto_device(monkeypatch):
    monkeypatch.setattr(devices.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert devices.resolve_device("auto") == "cuda"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.resolve_device("auto") == "cpu"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert devices.resolve_device("auto") == "cuda"
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    assert devices.resolve_device("auto") == "cpu"
    assert devices.resolve_device("cuda") == "cuda"


def test_frames_roundtrip_and_limits():
    r, w = os.pipe()
    try:
        wire.write_frame(w, b"hello")
        wire.write_frame(w, wire.dump_json({"a": 1}))
        assert wire.read_frame(r, 100) == b"hello"
        assert json.loads(wire.read_frame(r, 100)) == {"a": 1}
        wire.write_frame(w, b"x" * 50)
        with pytest.raises(wire.WireError, match="exceeds"):
            wire.read_frame(r, 10)
    finally:
        os.close(r)
        os.close(w)
    reader = wire.FrameReader(limit=1000)
    data = wire.HEADER.pack(3) + b"abc" + wire.HEADER.pack(2) + b"de"
    assert reader.feed(data[:5]) == [] and reader.feed(data[5:11]) == [b"abc"] and reader.feed(data[11:]) == [b"de"]
    assert reader.pending == 0


def test_torch_payload_refuses_code():
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    with pytest.raises(wire.WireError, match="unreadable payload"):
        wire.load_torch(pickle.dumps(Evil(), protocol=2))


def test_classify_points_at_candidate_line():
    path = "/tmp/candidate_for_classify.py"
    code = compile("def f():\n    x = 1\n    raise ValueError('bad\\nsecond line')\n", path, "exec")
    scope: dict = {}
    exec(code, scope)
    try:
        scope["f"]()
    except ValueError as exc:
        info = classify(exc, path, "shown.py")
    assert info == {"verdict": "crash", "message": "shown.py:3: ValueError: bad", "fatal": False}
    fault = classify(RuntimeError("CUDA error: an illegal memory access was encountered"), path, "shown.py")
    assert fault["verdict"] == "crash" and fault["fatal"] and "illegal memory access" in fault["message"]


def test_judge_implausible_and_floor(task):
    floor = task.floor_ms("S1", "cuda")
    rows = [{"name": "S1", "role": "public", "correct": True, "ms": floor * 0.5, "baseline_ms": floor * 2}]
    verdict, message, _ = verdicts.judge(task, "cuda", rows, None, "torch.softmax")
    assert verdict == "implausible" and "under the roofline floor" in message
    rows[0].update(ms=floor * 1.5, baseline_ms=floor * 1.5 * 20)
    verdict, message, _ = verdicts.judge(task, "cuda", rows, None, "torch.softmax")
    assert verdict == "implausible" and "plausible_speedup 10x" in message
    rows[0].update(ms=floor * 1.05, baseline_ms=floor * 2)
    verdict, _, warnings = verdicts.judge(task, "cuda", rows, None, "torch.softmax")
    assert verdict == "ok" and any("implied bandwidth" in w for w in warnings)
    rows[0].update(ms=floor * 3, baseline_ms=floor * 4)
    assert verdicts.judge(task, "cuda", rows, None, "torch.softmax") == ("ok", "", [])
    # The interpreter has no floor and no plausibility limit.
    assert verdicts.judge(task, "cpu", [{"name": "C1", "ms": 1e-9, "baseline_ms": 1.0}], None, "x")[0] == "ok"


def test_geomean_and_clean():
    assert verdicts.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert verdicts.geomean([]) is None and verdicts.geomean([1.0, 0.0]) is None
    assert verdicts.clean({"a": [float("nan"), 1.0], "b": float("inf")}) == {"a": [None, 1.0], "b": None}


def test_verdicts_are_closed():
    assert set(VERDICTS) == {"ok", "compile_error", "incorrect", "forbidden", "timeout", "crash", "implausible"}


def test_clock_sampler_summary(monkeypatch):
    from workbench.evaluator import envinfo

    rows = iter([
        {"clocks.sm": "1980", "clocks.mem": "3201", "temperature.gpu": "50", "power.draw": "300", "throttle.active": "0x1"},
        {"clocks.sm": "1755", "clocks.mem": "3201", "temperature.gpu": "57", "power.draw": "420", "throttle.active": "0x4"},
    ])
    monkeypatch.setattr(envinfo, "smi_query", lambda: next(rows, {}))
    sampler = envinfo.ClockSampler(interval_s=0.001)
    sampler.start()
    deadline = time.monotonic() + 10
    while len(sampler.samples) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    summary = sampler.stop()
    assert summary["sm_mhz"] == [1755.0, 1980.0] and summary["temp_c_max"] == 57.0 and summary["power_w_max"] == 420.0
    assert envinfo.throttled(summary) == "0x5"
    assert envinfo.throttled({"throttle.active": "0x0000000000000001"}) is None
