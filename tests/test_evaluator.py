"""The evaluator on the CPU interpreter: the self-test suite of known-good and known-bad candidates, then the pieces.

The suite (workbench/evaluator/selftest.py) runs once per test session, its cases in parallel; each case's verdict
and message are asserted by its own test, and the details that matter for the contract on top.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from workbench.evaluator import VERDICTS, EvalUsageError, evaluate, format_result, selftest
from workbench.evaluator import verdict as verdicts
from workbench.evaluator import wire
from workbench.evaluator.diagnose import classify
from workbench.evaluator.guards import check_static, forbidden_modules
from workbench.evaluator.guards import runtime as rguard
from workbench.evaluator.guards.static import jit_functions
from workbench.tasks import load_task

REPO = Path(__file__).resolve().parents[1]
CASES = selftest.CASES_DIR / "softmax"
SEED = REPO / "kernels" / "softmax" / "seed.py"
CONTRACT_KEYS = {"task", "file", "sha256", "device", "verdict", "message", "shapes", "speedup", "timing_comparable"}
SHAPE_KEYS = {"name", "correct", "rel_err", "ms", "baseline_ms", "speedup", "floor_ms"}
CPU_CASES = selftest.cases_for("cpu")


@pytest.fixture(scope="module")
def task():
    return load_task("softmax")


@pytest.fixture(scope="module")
def suite():
    """Every CPU self-test case, evaluated once, three at a time (each spends most of its time importing torch)."""
    return {o.case.name: o for o in selftest.run_suite("cpu")}


def assert_contract(result):
    assert CONTRACT_KEYS <= set(result)
    assert result["verdict"] in VERDICTS
    assert "\n" not in result["message"] and result["message"]
    json.dumps(result, allow_nan=False)  # strict JSON: no NaN/inf anywhere
    for shape in result["shapes"]:
        assert SHAPE_KEYS <= set(shape)


# -- the self-test suite, case by case -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [c.name for c in CPU_CASES])
def test_selftest_case(suite, name):
    outcome = suite[name]
    assert outcome.passed, f"{name}: {outcome.problem}: {outcome.message}"
    if outcome.result is not None:
        assert_contract(outcome.result)


def test_suite_covers_the_brief():
    names = {c.name for c in selftest.CASES}
    for must in ("zeros", "returns_input", "calls_reference", "torch_softmax", "torch_matmul", "sdpa",
                 "forbidden_import", "mutate_input", "uninit_alias", "thread_defer", "side_stream", "side_stream_rt",
                 "caches_results", "lazy_subclass", "patch_timer", "fp16_compute", "nan_out", "hang", "segfault",
                 "syntax_error", "wrong_shape", "wrong_dtype", "overfit_public", "seed", "good_simple"):
        assert must in names
    for case in selftest.CASES:
        assert case.file == "@seed" or (CASES / case.file).is_file(), case.file
    assert [c.name for c in selftest.cases_for("cuda") if c.name.endswith("_rt") and "cuda" == c.devices[0]] == \
        ["side_stream_rt"]
    with pytest.raises(KeyError, match="unknown self-test case"):
        selftest.cases_for("cpu", ["nope"])


def test_selftest_judge_and_table():
    case = selftest.Case("x", "zeros.py", ("incorrect",), {"cpu": "C1", "cuda": "S1"}, "demo")
    assert selftest.judge(case, {"verdict": "ok", "message": ""}, "cpu") == "got ok, expected incorrect"
    assert selftest.judge(case, {"verdict": "incorrect", "message": "shape S1"}, "cpu") == "message lacks 'C1'"
    assert selftest.judge(case, {"verdict": "incorrect", "message": "shape S1"}, "cuda") is None
    outcome = selftest.Outcome(case, "ok", "fine", False, "got ok, expected incorrect", 1.0, None)
    table = selftest.format_table([outcome], "cpu")
    assert "0/1 cases as expected" in table and "FAIL" in table and "got ok, expected incorrect: fine" in table


# -- what the good candidates' results carry -------------------------------------------------------------------------


def test_seed_result(suite, task):
    result = suite["seed"].result
    assert result["device"] == "cpu-interpret" and result["timing_comparable"] is False
    assert result["sha256"] == hashlib.sha256(SEED.read_bytes()).hexdigest()
    assert [s["name"] for s in result["shapes"]] == [s.name for s in task.shapes["cpu"]]
    for shape in result["shapes"]:
        assert shape["correct"] is True and shape["seeds_checked"] == 3
        assert 0 <= shape["rel_err"] <= task.tol("y")
        assert shape["ms"] > 0 and shape["baseline_ms"] > 0 and shape["speedup"] > 0
        assert shape["floor_ms"] is None
        assert shape["spot_checks"] >= 1 and shape["revalidated"] is True
        assert len(shape["call_ms"]) == 3
    assert result["speedup"] > 0 and result["baseline"] == "torch.softmax"
    assert "heldout" not in result and "profile" not in result and result["quarantined"] is False
    assert result["env"]["interpreter"] is True and result["env"]["triton"]
    assert result["timing"]["inputs"].startswith("generated in both processes")
    assert result["elapsed_s"] < 120


def test_heldout_shapes_are_reported_separately(suite, task):
    result = suite["overfit_public"].result
    assert [s["name"] for s in result["heldout"]] == [s.name for s in task.shapes["heldout_cpu"]]
    assert [s["name"] for s in result["shapes"]] == [s.name for s in task.shapes["cpu"]]


def test_failure_messages_point_at_lines(suite):
    assert f"{CASES / 'raises.py'}:6: RuntimeError: kernel launch failed on purpose" in suite["raises"].message
    assert f"{CASES / 'triton_compile_error.py'}:10:" in suite["triton_compile_error"].message
    assert suite["syntax_error"].message.startswith(f"{CASES / 'syntax_error.py'}:5: SyntaxError")
    assert suite["forbidden_import"].message.startswith(f"{CASES / 'forbidden_import.py'}:5: import of 'flash_attn'")
    assert f"{CASES / 'torch_softmax.py'}:8: torch.nn.functional.softmax" in suite["torch_softmax"].message
    assert f"{CASES / 'forbidden_import.py'}:5: the candidate imports 'flash_attn'" in suite["forbidden_import_rt"].message
    segfault = suite["segfault"].message
    assert "SIGSEGV" in segfault and f"{CASES / 'segfault.py'}:" in segfault and "shape C1, seed 0" in segfault
    assert suite["forbidden_import"].result["findings"][0]["line"] == 5
    assert suite["syntax_error"].result["elapsed_s"] < 2
    assert suite["hang"].result["elapsed_s"] < 40


def test_incorrect_results_have_no_speedup(suite):
    for name in ("zeros", "nan_out", "mutate_input", "caches_results", "stateful_drift"):
        result = suite[name].result
        assert result["speedup"] is None
        assert any(s["correct"] is False and s["problem"] for s in result["shapes"])


def test_static_guards_can_be_switched_off_only_explicitly(suite):
    assert suite["torch_softmax"].result.get("static_guards") is None
    assert suite["torch_softmax_rt"].result["static_guards"] is False


def test_format_result(suite):
    text = format_result(suite["seed"].result)
    assert "verdict: ok" in text and "C3" in text and "torch.softmax" in text and "not comparable" in text
    text = format_result(suite["no_max"].result)
    assert "verdict: incorrect" in text and "C1: seed 1" in text


def test_missing_file_is_usage_error(task, tmp_path):
    with pytest.raises(EvalUsageError, match="candidate file not found"):
        evaluate(task, tmp_path / "nope.py", device="cpu")
    with pytest.raises(EvalUsageError, match="unknown device"):
        evaluate(task, SEED, device="tpu")
    with pytest.raises(EvalUsageError, match="seeds"):
        evaluate(task, SEED, device="cpu", seeds=0)


def test_calling_process_never_imports_torch():
    code = (
        "import sys; import workbench.evaluator, workbench.tasks, workbench.profiler; "
        "from workbench.evaluator import selftest; "
        "bad = [m for m in ('torch', 'triton', 'numpy', 'textual', 'rich') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- static guards ---------------------------------------------------------------------------------------------------


def findings(task, source):
    return [(f.rule, f.line) for f in check_static(task, textwrap.dedent(source))]


def test_static_guard_imports(task):
    src = """\
        import torch
        from flash_attn.ops import x
        import fla.layers as L
        m = __import__('xformers')
        import importlib
        import flask
        import threading, math
        from torch.utils import cpp_extension
        from . import helper
        import triton.language as tl
        from triton.tools.tensor_descriptor import TensorDescriptor
        from triton.tools import disasm
        import triton.runtime.driver
        s = torch._C._cuda_getCurrentRawStream(0)
        t = torch._C._cuda_getCurrentRawStreamX(0)
        u = torch._C._cuda_getCurrentStream(0)
    """
    assert findings(task, src) == [
        ("forbidden-import", 2), ("forbidden-import", 3), ("forbidden-import", 4), ("import-not-allowed", 5),
        ("import-not-allowed", 6), ("import-not-allowed", 7), ("forbidden-api", 8), ("import-not-allowed", 9),
        ("forbidden-api", 12), ("forbidden-api", 13), ("forbidden-api", 15), ("forbidden-api", 16),
    ]


def test_static_guard_torch_ops(task):
    src = """\
        import torch
        import math
        import triton
        import triton.language as tl
        from torch import exp
        @triton.jit
        def k(p):
            v = tl.exp(tl.load(p))
            w = v.exp()
        def f(x):
            a = math.exp(1.0)
            b = x.softmax(-1)
            c = torch.special.exp2(x)
            d = torch.Tensor.exp
            return torch.empty_like(x)
    """
    assert findings(task, src) == [
        ("forbidden-torch-op", 5), ("forbidden-torch-op", 12), ("forbidden-torch-op", 13), ("forbidden-torch-op", 14),
    ]


def test_static_guard_tampering_and_evasion(task):
    src = """\
        import torch
        import time as t
        torch.cuda.Event.elapsed_time = None
        s = torch.cuda.Stream()
        c = torch._C
        def f(x, input=None, _o=open):
            y = getattr(torch, "soft" + "max")
            z = x.__class__
            w = getattr(x, "shape")
            with torch.autocast("cuda"):
                pass
            try:
                pass
            except Exception:
                pass
            exec("1")
            q = input
            class T(torch.Tensor):
                pass
            return type("L", (torch.Tensor,), {})
    """
    got = findings(task, src)
    assert ("import-not-allowed", 2) in got
    assert ("patches-module", 3) in got
    assert ("forbidden-api", 4) in got and ("forbidden-api", 5) in got
    assert ("forbidden-builtin", 6) in got  # open as a default value
    assert ("dynamic-attr", 7) in got and ("dunder-access", 8) in got
    assert not any(line == 9 for _, line in got), "getattr with a plain name is fine"
    assert ("forbidden-api", 10) in got and ("try-except", 12) in got and ("forbidden-builtin", 16) in got
    assert not any(line == 17 for _, line in got), "a parameter named input is not the builtin"
    assert ("tensor-subclass", 18) in got and ("tensor-subclass", 20) in got


def test_static_guard_passes_shipped_kernels():
    for task_name, file in (("softmax", "seed.py"), ("kda", "kda_chunked.py"), ("kda", "seed.py"),
                            ("mla_decode", "mla_splitkv.py"), ("mla_decode", "seed.py")):
        t = load_task(task_name)
        assert check_static(t, (REPO / "kernels" / task_name / file).read_text()) == [], file
    assert check_static(load_task("softmax"), (CASES / "good_simple.py").read_text()) == []


def test_jit_functions():
    import ast

    src = textwrap.dedent("""\
        import triton
        import triton.language as tl
        from triton import jit
        @triton.autotune(configs=[], key=[])
        @triton.jit
        def a(p): pass
        @jit
        def b(p): pass
        def c(p): pass
    """)
    assert jit_functions(ast.parse(src)) == ["a", "b"]
    assert jit_functions(ast.parse(SEED.read_text())) == ["_softmax_loop", "_softmax_tile"]


# -- run-time guards -------------------------------------------------------------------------------------------------


def test_runtime_module_guard():
    assert forbidden_modules(["torch", "fla.layers", "flask", "flash_attn"], ["fla", "flash_attn"]) == [
        "fla", "flash_attn"]


def test_audit_guard_refuses_only_the_candidates_own_events(tmp_path):
    # In a subprocess: an audit hook cannot be removed once added.
    cand = tmp_path / "cand.py"
    cand.write_text("import json\n\ndef go():\n    __import__('wave')\n\ndef read():\n    return open(__file__).read()\n")
    code = textwrap.dedent(f"""\
        import importlib.util, sys
        from workbench.evaluator.guards.runtime import AuditGuard
        guard = AuditGuard({str(cand)!r})
        guard.install()
        spec = importlib.util.spec_from_file_location("cand", {str(cand)!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        import fractions  # the harness's own import: not the candidate's
        for fn in (mod.go, mod.read):
            try:
                fn()
                print("allowed", fn.__name__)
            except PermissionError:
                print("refused", fn.__name__)
        for line, message in guard.violations:
            print(line, message)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[:2] == ["refused go", "refused read"]
    assert out[2].startswith("4 imports 'wave' at run time") and out[3].startswith("7 raised the audit event open")
    assert len(out) == 4, "importing json (loaded at start-up) and the harness's fractions raise nothing"


def test_namespace_violations(tmp_path):
    import types

    mod = types.ModuleType("candidate")
    exec("import os\nimport math\nfrom os import path as p\nfrom subprocess import run\nX = 1\n", mod.__dict__)
    found = rguard.namespace_violations(mod)
    assert found == ["module os (as os)", "module posixpath (as p)", "subprocess.run (as run)"]


def test_op_recorder_allows_only_allocation_views_and_copies():
    import torch

    x = torch.randn(4, 4)
    with rguard.make_op_recorder() as rec:
        y = torch.empty_like(x)
        y.copy_(x.t().contiguous())
        z = x.view(16)[2:5].clone()
    assert rec.disallowed == {}
    with rguard.make_op_recorder() as rec:
        _ = (x @ x).exp().sum()
        _ = torch.softmax(z, -1)
    assert set(rec.disallowed) == {"aten.mm", "aten.exp", "aten.sum", "aten._softmax"}


def test_timer_identity_check(monkeypatch):
    snap = rguard.snapshot_timers()
    assert rguard.replaced_timers(snap) == []
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    assert rguard.replaced_timers(snap) == ["time.perf_counter"]


def test_threads_are_seen():
    import threading

    before = rguard.python_threads()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert rguard.python_threads() - before == {t.ident}
    finally:
        stop.set()
        t.join()


# -- slabs, inputs, timing -------------------------------------------------------------------------------------------


def test_slab_roundtrip_and_growth(tmp_path):
    import torch

    from workbench.evaluator import slab

    writer, reader = slab.Slab(str(tmp_path / "s")), slab.Slab(str(tmp_path / "s"))
    msg = {"a": torch.arange(10, dtype=torch.float32).view(2, 5).t(), "b": [torch.tensor(True), None, 3.5],
           "c": torch.zeros(0, 4, dtype=torch.bfloat16), "d": torch.randn(3).to(torch.bfloat16)}
    packed = writer.pack(msg)
    json.dumps(packed)
    back = reader.unpack(packed)
    assert torch.equal(back["a"], msg["a"]) and back["a"].is_contiguous()
    assert back["b"][0].item() is True and back["b"][1:] == [None, 3.5]
    assert back["c"].shape == (0, 4) and torch.equal(back["d"], msg["d"])
    big = torch.randn(1 << 16)
    back = reader.unpack(writer.pack([big]))
    assert torch.equal(back[0], big) and writer.bytes_moved > big.numel() * 4
    bad = dict(packed["a"], offset=1 << 40)
    with pytest.raises(slab.SlabError, match="outside"):
        reader.unpack(bad)
    with pytest.raises(slab.SlabError, match="dtype"):
        reader.unpack(dict(packed["a"], dtype="Tensor"))
    with pytest.raises(slab.SlabError, match="does not match"):
        reader.unpack(dict(packed["a"], shape=[3, 3]))


def test_fingerprints_and_mutation_check():
    import torch

    from workbench.evaluator import inputs

    x = torch.randn(33, 7)
    a = {"x": x, "scale": 0.5}
    b = inputs.clone(a)
    assert inputs.fingerprint(a) == inputs.fingerprint(b) and inputs.same(a, b) == []
    b["x"].view(-1)[5] = torch.nextafter(b["x"].view(-1)[5], torch.tensor(float("inf")))
    assert inputs.fingerprint(a)["x"] != inputs.fingerprint(b)["x"] and inputs.same(b, a) == ["x"]
    swapped = {"x": x.flip(0).contiguous()}
    assert inputs.tensor_fingerprint(swapped["x"]) != inputs.tensor_fingerprint(x)  # position-sensitive
    assert inputs.fingerprint({"n": 3}) == {"n": "value:3"}
    odd = torch.ones(3, dtype=torch.uint8)  # not a multiple of 4 bytes
    assert inputs.tensor_fingerprint(odd).startswith("uint8[3]:")
    dst = {"x": torch.zeros(33, 7), "scale": 0.5}
    inputs.refill(dst, a)
    assert torch.equal(dst["x"], x)
    assert torch.equal(inputs.subset_index(1 << 20, 7), inputs.subset_index(1 << 20, 7))
    assert inputs.subset_index(10, 7).tolist() == list(range(10))


def test_timer_hooks_on_cpu():
    from workbench.evaluator import timing

    timer = timing.Timer("cpu")
    seen = []
    ms, out = timer.block(lambda v: v * 2, {"v": 3}, 4, refill=lambda i: seen.append(("refill", i)),
                         keep=lambda i, o: seen.append(("keep", i, o)))
    assert len(ms) == 4 and out == 6
    assert seen[:2] == [("refill", 0), ("keep", 0, 6)]
    # The timers measure the call itself: a 20 ms call reads as 20 ms, not as zero or as the refill's time. The
    # refill is ten times the call, so a loaded CI host that oversleeps the call (48 ms seen under xdist) still
    # reads far below call + refill (220 ms).
    ms, _ = timer.block(lambda: time.sleep(0.02), {}, 2, refill=lambda i: time.sleep(0.2))
    assert all(18 <= t < 150 for t in ms), ms
    wall, out = timer.isolated(lambda v: (time.sleep(0.02), v + 1)[1], {"v": 1}, refill=lambda i: time.sleep(0.2))
    assert 18 <= wall < 150 and out == 2
    assert timing.block_size(0.01, "cuda") == timing.MAX_BLOCK and timing.block_size(50.0, "cuda") == timing.MIN_BLOCK
    assert timing.block_size(1.0, "cuda") == 12 and timing.block_size(1.0, "cpu") == 1


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux-only")
def test_pinning_uses_only_allowed_cpus_and_gives_them_back():
    from workbench.evaluator import timing

    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    with timing.pinned(cpu) as got:
        assert got == cpu and os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == allowed
    assert timing.pin_cpu(max(allowed) + 1000) is None and os.sched_getaffinity(0) == allowed
    assert timing.pin_cpu(None) is None


# -- verdicts and pieces ---------------------------------------------------------------------------------------------


def test_frames_roundtrip_and_limits():
    r, w = os.pipe()
    try:
        wire.write_frame(w, b"hello")
        wire.write_frame(w, wire.dump_json({"a": 1, "nan": float("nan")}))
        assert wire.read_frame(r, 100) == b"hello"
        back = json.loads(wire.read_frame(r, 100))
        assert back["a"] == 1 and back["nan"] != back["nan"]
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


H200 = "NVIDIA H200"


def test_judge_implausible_and_floor(task):
    floor = task.floor_ms("S1", "cuda", H200)
    rows = [{"name": "S1", "role": "public", "correct": True, "ms": floor * 0.5, "baseline_ms": floor * 2}]
    verdict, message, _ = verdicts.judge(task, "cuda", rows, None, "torch.softmax", H200)
    assert verdict == "implausible" and "under the roofline floor" in message
    assert verdicts.quarantine(task, "cuda", verdict, rows, H200) == "implausible timing"
    rows[0].update(ms=floor * 1.5, baseline_ms=floor * 1.5 * 20)
    verdict, message, _ = verdicts.judge(task, "cuda", rows, None, "torch.softmax", H200)
    assert verdict == "implausible" and "plausible_speedup 10x" in message
    rows[0].update(ms=floor * 1.05, baseline_ms=floor * 2)
    verdict, _, warnings = verdicts.judge(task, "cuda", rows, None, "torch.softmax", H200)
    assert verdict == "ok" and any("above the H200's measured copy rate 4.25 TB/s" in w for w in warnings)
    assert "within 10% of its roofline floor" in verdicts.quarantine(task, "cuda", verdict, rows, H200)
    rows[0].update(ms=floor * 3, baseline_ms=floor * 4)
    assert verdicts.judge(task, "cuda", rows, None, "torch.softmax", H200) == ("ok", "", [])
    assert verdicts.quarantine(task, "cuda", "ok", rows, H200) is None
    # A launch-bound baseline: 20x by events, 2x in GPU time under graphs. Judged on GPU time, with a warning.
    rows[0].update(ms=floor * 3, baseline_ms=floor * 60, graph_ms=floor * 3, baseline_graph_ms=floor * 6)
    verdict, _, warnings = verdicts.judge(task, "cuda", rows, None, "torch.softmax", H200)
    assert verdict == "ok" and any("in GPU time under CUDA graphs" in w for w in warnings)
    # A candidate fast only under graphs (or only by events) is judged on its faster time.
    rows[0].update(graph_ms=floor * 0.2)
    verdict, message, _ = verdicts.judge(task, "cuda", rows, None, "torch.softmax", H200)
    assert verdict == "implausible" and "under the roofline floor" in message
    rows[0].update(graph_ms=floor * 1.2, baseline_graph_ms=floor * 30)
    verdict, message, _ = verdicts.judge(task, "cuda", rows, None, "torch.softmax", H200)
    assert verdict == "implausible" and "25x faster" in message
    # Near the floor only under a graph is quarantined like near it by events.
    rows[0].update(ms=floor * 3, baseline_ms=floor * 4, graph_ms=floor * 1.05, baseline_graph_ms=floor * 4)
    assert "within 10% of its roofline floor" in verdicts.quarantine(task, "cuda", "ok", rows, H200)
    # An unknown GPU is judged against the largest known peaks (a lower floor), and the result says so.
    rows[0].update(ms=floor * 0.9, baseline_ms=floor * 2, graph_ms=None, baseline_graph_ms=None)
    verdict, _, warnings = verdicts.judge(task, "cuda", rows, None, "torch.softmax", "Future GPU")
    assert verdict == "ok" and any("GPU Future GPU is not in the peak table" in w for w in warnings)
    # The interpreter has no floor and no plausibility limit.
    assert verdicts.judge(task, "cpu", [{"name": "C1", "ms": 1e-9, "baseline_ms": 1.0}], None, "x")[0] == "ok"


def test_judge_wrong_before_forbidden_before_implausible(task):
    floor = task.floor_ms("S1", "cuda", H200)
    rows = [{"name": "S1", "role": "public", "correct": True, "ms": floor * 0.1, "baseline_ms": floor * 2,
             "forbidden": "k.py: forward launched GPU kernels that are not the candidate's"},
            {"name": "S2", "role": "public", "correct": False, "problem": "seed 0: wrong"}]
    assert verdicts.judge(task, "cuda", rows, None, "b")[0] == "incorrect"
    verdict, message, _ = verdicts.judge(task, "cuda", rows[:1], None, "b")
    assert verdict == "forbidden" and message.endswith("(shape S1)")


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
    monkeypatch.setattr(envinfo.nvml, "query", lambda target=None: None)  # the nvidia-smi path, even on a GPU box
    sampler = envinfo.ClockSampler(interval_s=0.001)
    sampler.start()
    deadline = time.monotonic() + 10
    while len(sampler.samples) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    summary = sampler.stop()
    assert summary["sm_mhz"] == [1755.0, 1980.0] and summary["temp_c_max"] == 57.0 and summary["power_w_max"] == 420.0
    assert envinfo.throttled(summary) == "0x5"
    assert envinfo.throttled({"throttle.active": "0x0000000000000001"}) is None


# -- CLI wiring (doctor --selftest, profile) -------------------------------------------------------------------------


def test_doctor_selftest_exit_code(monkeypatch, capsys):
    from workbench import cli

    case = selftest.CASES[0]
    good = selftest.Outcome(case, "ok", "fine", True, None, 0.1, None)
    bad = selftest.Outcome(case, "incorrect", "nope", False, "got incorrect, expected ok", 0.1, None)
    monkeypatch.setattr("workbench.devices.default_device", lambda: "cpu")
    monkeypatch.setattr(selftest, "run_suite", lambda device: [good])
    assert cli.main(["doctor", "--selftest"]) == 0
    assert "1/1 cases as expected" in capsys.readouterr().out
    monkeypatch.setattr(selftest, "run_suite", lambda device: [good, bad])
    assert cli.main(["doctor", "--selftest"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_profile_command_prints_table_deltas_and_json(monkeypatch, capsys, tmp_path, task):
    from workbench import cli
    from workbench.profiler import attribute, kernel_table, summary

    fixture = json.loads((REPO / "tests/fixtures/profiler/torch_events_seed_S1.json").read_text())
    rows = [{"name": "S1", "ms": 0.0367, "wall_ms": 0.08,
             "profile": {"calls": 5, "kernel_ms": 0.0336, "kernels": kernel_table(attribute(fixture))}}]
    canned = {"task": "softmax", "file": str(SEED), "sha256": "x", "device": "cuda:NVIDIA H200", "verdict": "ok",
              "message": "correct", "shapes": [{"name": "S1", "correct": True, "rel_err": 1e-7, "ms": 0.0367,
                                                 "baseline_ms": 0.0588, "speedup": 1.6, "floor_ms": 0.028}],
              "speedup": 1.6, "timing_comparable": True, "profile": summary.build(task, rows, [], 132)}
    monkeypatch.setattr("workbench.devices.default_device", lambda: "cuda")
    monkeypatch.setattr("workbench.evaluator.evaluate", lambda *a, **k: json.loads(json.dumps(canned)))
    previous = tmp_path / "prev.json"
    old = json.loads(json.dumps(canned))
    old["profile"]["shapes"][0]["ms"] = 0.05
    previous.write_text(json.dumps(old))
    assert cli.main(["profile", "softmax", str(SEED), "--against", str(previous)]) == 0
    out = capsys.readouterr().out
    assert "memory-bound" in out and "_softmax_tile" in out and "delta: S1: time 0.05 ms -> 0.0367 ms" in out
    assert cli.main(["profile", "softmax", str(SEED), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"]["shapes"][0]["name"] == "S1"
    assert cli.main(["profile", "softmax", str(SEED), "--shape", "C1"]) == 2
    assert "not a CUDA shape" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    assert cli.main(["profile", "softmax", str(SEED), "--against", str(bad)]) == 2
    monkeypatch.setattr("workbench.devices.default_device", lambda: "cpu")
    assert cli.main(["profile", "softmax", str(SEED), "--ncu"]) == 2
    assert "--ncu needs an NVIDIA GPU" in capsys.readouterr().err
    assert cli.main(["profile", "softmax", str(SEED), "--sanitize", "memcheck"]) == 2
    assert "--sanitize needs an NVIDIA GPU" in capsys.readouterr().err


def test_precision_is_judged_per_output_against_its_own_tolerance():
    """MLA has o at 1.5e-2 and lse at 2e-3: the baseline's o error must not be held against lse's tolerance."""
    from workbench.evaluator.phases.correctness import precision_warnings

    row = {"rel_err_by_output": {"o": 2e-3, "lse": 1.5e-7}, "baseline_rel_err_by_output": {"o": 5.6e-3, "lse": 4.7e-5}}
    assert precision_warnings(row, "M1", {"o": 1.5e-2, "lse": 2e-3}) == [] and "precision_flag" not in row
    assert row["err_ratio"] == pytest.approx(2e-3 / 5.6e-3)
    # A candidate ten times less precise than the baseline on lse, and near lse's tolerance, is flagged on lse.
    row = {"rel_err_by_output": {"o": 2e-3, "lse": 1.8e-3}, "baseline_rel_err_by_output": {"o": 5.6e-3, "lse": 4.7e-5}}
    warnings = precision_warnings(row, "M1", {"o": 1.5e-2, "lse": 2e-3})
    assert row["precision_flag"] is True
    assert len(warnings) == 1 and "on lse" in warnings[0]
    # A baseline whose own error nears an output's tolerance is reported, naming that output.
    warnings = precision_warnings({"rel_err_by_output": {"o": 1e-2}, "baseline_rel_err_by_output": {"o": 1.3e-2}},
                                  "X", {"o": 1.5e-2})
    assert warnings and "error on o" in warnings[0]
