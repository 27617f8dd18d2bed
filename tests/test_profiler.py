"""The profiler's pure parts on recorded H200 output: kernel attribution, ncu CSV, roofline, rules, deltas."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from workbench.devices import peaks_for
from workbench.profiler import advise, attribute, classify, diff, kernel_table, ncu, per_call_ms, provenance
from workbench.profiler import kernels as kmod
from workbench.profiler import summary

H200 = peaks_for("NVIDIA H200")

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "profiler"
SEED_KERNELS = ["_softmax_loop", "_softmax_tile"]


def events(name):
    return json.loads((FIXTURES / name).read_text())


# -- kernel table from torch.profiler events (recorded: seed kernel, softmax S1, H200) -------------------------------


def test_seed_events_attribute_to_five_calls_with_a_marker_each():
    calls = attribute(events("torch_events_seed_S1.json"))
    assert len(calls) == 5
    for call in calls:
        assert call[0].get("marker") and call[0]["kind"] == "memcpy"
        assert [e["name"] for e in call[1:]] == ["_softmax_tile"]
    sums = per_call_ms(calls)
    assert all(0.02 < s < 0.06 for s in sums)  # 4096 x 4096 fp32 at ~4 TB/s is ~34 us


def test_seed_kernel_table_and_provenance():
    calls = attribute(events("torch_events_seed_S1.json"))
    table = kernel_table(calls)
    assert [r["name"] for r in table] == ["_softmax_tile"]
    row = table[0]
    assert row["calls"] == 5 and row["share"] == pytest.approx(1.0)
    assert row["mean_ms"] == pytest.approx(row["total_ms"] / 5)
    assert provenance(calls, SEED_KERNELS) == []
    # The same trace judged against a candidate that defines other kernels: the seed's kernel is foreign.
    problems = provenance(calls, ["my_kernel"])
    assert len(problems) == 1 and "_softmax_tile (x5)" in problems[0]


def test_side_stream_events_are_flagged():
    calls = attribute(events("torch_events_side_stream.json"))
    problems = provenance(calls, SEED_KERNELS)
    assert len(problems) == 1 and "besides the caller's stream" in problems[0]
    marker = calls[0][0]["stream"]
    assert all(e["stream"] != marker for e in calls[0][1:])


def test_activity_outside_windows_is_dropped_and_housekeeping_allowed():
    evs = [
        {"name": "wb::call0", "device": "cpu", "kind": "annotation", "start_ns": 100, "dur_ns": 100},
        {"name": "flush", "device": "cuda", "kind": "kernel", "start_ns": 50, "dur_ns": 40, "stream": 7},
        {"name": "Memcpy DtoD", "device": "cuda", "kind": "memcpy", "start_ns": 110, "dur_ns": 2, "stream": 7},
        {"name": "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
         "device": "cuda", "kind": "kernel", "start_ns": 120, "dur_ns": 5, "stream": 7},
        {"name": "mine", "device": "cuda", "kind": "kernel", "start_ns": 130, "dur_ns": 50, "stream": 7},
        {"name": "sm90_xmma_gemm_f32f32_tf32f32", "device": "cuda", "kind": "kernel", "start_ns": 185,
         "dur_ns": 10, "stream": 7},
    ]
    calls = attribute(evs)
    assert [e["name"] for e in calls[0]][1:] == [evs[3]["name"], "mine", "sm90_xmma_gemm_f32f32_tf32f32"]
    assert per_call_ms(calls) == [pytest.approx(65e-6)]
    assert per_call_ms(calls, kernels_only=True) == [pytest.approx(65e-6)]
    problems = provenance(calls, ["mine"])
    assert len(problems) == 1 and "sm90_xmma_gemm" in problems[0] and "FillFunctor" not in problems[0]
    assert kmod.owned("mine_0d1d", ["mine"]) and not kmod.owned("minefield", ["mine"])


def test_format_table():
    lines = kmod.format_table(kernel_table(attribute(events("torch_events_seed_S1.json"))))
    assert lines[0].split() == ["kernel", "calls", "total_ms", "mean_ms", "share"]
    assert "_softmax_tile" in lines[1] and "100.0%" in lines[1]
    assert kmod.format_table([]) == ["  (no GPU activity recorded)"]


# -- Nsight Compute CSV (recorded 2026-11-30: ncu 2025.3.1, seed kernel, softmax S1, H200) ----------------------------


def test_parse_recorded_ncu_csv():
    launches = ncu.parse_csv((FIXTURES / "ncu_seed_S1.csv").read_text())
    assert len(launches) == 1
    launch = launches[0]
    assert launch["kernel"] == "_softmax_tile" and launch["grid_text"] == "(4096, 1, 1)"
    m = launch["metrics"]
    assert m["registers"] == 54 and m["grid"] == 4096 and m["block"] == 128
    assert m["dram_read_bytes"] == 67131904  # "67,131,904" in the CSV
    assert 0 < m["dram_pct"] <= 100 and 0 < m["occupancy_pct"] <= 100 and 0 <= m["l2_hit_pct"] <= 100
    # L2 throughput and bytes (added 2026-11-30): the seed streams 64 MB in and out, all of it through L2.
    assert 0 < m["l2_pct"] <= 100 and m["l2_bytes"] >= 2 * 64 * 2**20
    assert set(ncu.METRICS) <= set(m), sorted(set(ncu.METRICS) - set(m))  # every curated metric came back


def test_summarize_derives_rates_and_stalls():
    rows = ncu.summarize(ncu.parse_csv((FIXTURES / "ncu_seed_S1.csv").read_text()))
    assert len(rows) == 1 and rows[0]["launches"] == 1
    m = rows[0]["metrics"]
    assert m["smem_per_block"] == m["smem_static"] + m["smem_dynamic"]
    assert m["flops"] == m["fadd"] + m["fmul"] + 2 * m["ffma"] + m["hadd"] + m["hmul"] + 2 * m["hfma"] + \
        m["dadd"] + m["dmul"] + 2 * m["dfma"]
    moved = m["dram_read_bytes"] + m["dram_write_bytes"]
    assert m["bytes_per_s"] == pytest.approx(moved / (m["duration_ns"] * 1e-9))
    assert 1e12 < m["bytes_per_s"] < 4.8e12
    top = m["stall_top"]
    assert len(top) == 3 and top[0]["cycles"] >= top[1]["cycles"] >= top[2]["cycles"]
    assert m["l2_bytes_per_s"] == pytest.approx(m["l2_bytes"] / (m["duration_ns"] * 1e-9))
    assert m["l2_bytes_per_s"] > m["bytes_per_s"]  # every DRAM byte passes through L2
    lines = ncu.format_rows(rows)
    assert lines[0].startswith("  _softmax_tile (x1):") and "occupancy" in lines[0]
    assert f"L2 {m['l2_pct']:.0f}% (hit {m['l2_hit_pct']:.0f}%)" in lines[0]
    assert f"L2 {m['l2_bytes_per_s'] / 1e12:.2f} TB/s" in lines[1]
    assert any("stalls (cycles/issue): long_scoreboard" in ln for ln in lines)


def test_parse_raw_page_and_averages_launches():
    text = "\n".join([
        "==PROF== Connected to process 1",
        '"ID","Kernel Name","Stream","gpu__time_duration.sum","launch__registers_per_thread","custom__metric"',
        '"","","","nsecond","register/thread",""',
        '"0","k","7","1,000","32","5"',
        '"1","k","7","3,000","32","7"',
    ])
    launches = ncu.parse_csv(text)
    assert [l["metrics"]["duration_ns"] for l in launches] == [1000, 3000]
    rows = ncu.summarize(launches)
    assert rows[0]["launches"] == 2 and rows[0]["metrics"]["duration_ns"] == 2000
    assert rows[0]["metrics"]["custom__metric"] == 6
    with pytest.raises(ncu.NcuError, match="no CSV"):
        ncu.parse_csv("==PROF== nothing here")


def test_explain_failure_lines():
    assert "ERR_NVGPUCTRPERM" in ncu.explain_failure("==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                                                     "permission to access NVIDIA GPU Performance Counters", 1)
    assert "cannot profile on this machine" in ncu.explain_failure(
        "==ERROR== Failed to initialize the profiler: LibraryNotLoaded", 1)
    assert "profiled no kernels" in ncu.explain_failure("==WARNING== No kernels were profiled.", 0)
    assert ncu.explain_failure("==ERROR== something odd\nmore", 3) == "ncu failed: ==ERROR== something odd"
    for text in (ncu.explain_failure("", 9),):
        assert "\n" not in text and "status 9" in text


def test_run_without_ncu_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(ncu.shutil, "which", lambda name: None)
    monkeypatch.setattr(ncu.os.path, "exists", lambda path: False)
    with pytest.raises(ncu.NcuError, match="not installed or not on PATH"):
        ncu.run("softmax", tmp_path / "k.py", "S1")


def _fake_ncu(tmp_path: Path, script: str) -> str:
    exe = tmp_path / "ncu"
    exe.write_text("#!/usr/bin/env bash\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_run_parses_a_fake_ncu_and_retries_unknown_metrics(tmp_path):
    # A stand-in for ncu: first run rejects one metric, second writes the recorded CSV to --log-file.
    state = tmp_path / "calls"
    exe = _fake_ncu(tmp_path, f"""
log=""; metrics=""
while [ $# -gt 0 ]; do
  case "$1" in --log-file) log="$2"; shift;; --metrics) metrics="$2"; shift;; esac; shift
done
echo x >> {state}
if [ "$(wc -l < {state})" = "1" ]; then echo "==ERROR== Failed to find metric lts__t_sector_hit_rate.pct"; exit 1; fi
case "$metrics" in *lts__t_sector_hit_rate.pct*) echo "retried with the bad metric"; exit 2;; esac
cp {FIXTURES / 'ncu_seed_S1.csv'} "$log"
""")
    result = ncu.run("softmax", FIXTURES / "record_gpu.py", "S1", ncu=exe)
    assert result["dropped"] == ["lts__t_sector_hit_rate.pct"]
    assert result["rows"][0]["kernel"] == "_softmax_tile" and result["launches"] == 1
    assert "--clock-control none" in result["command"] and "--profile-from-start off" in result["command"]
    assert "workbench.profiler.drive --task softmax" in result["command"]


def test_run_profiles_on_the_gpu_it_is_given(tmp_path):
    """A slot's observer runs ncu on that slot's GPU (CUDA_VISIBLE_DEVICES), not on this process's first one."""
    seen = tmp_path / "visible"
    exe = _fake_ncu(tmp_path, f"""
log=""
while [ $# -gt 0 ]; do case "$1" in --log-file) log="$2"; shift;; esac; shift; done
echo "${{CUDA_VISIBLE_DEVICES-unset}}" >> {seen}
cp {FIXTURES / 'ncu_seed_S1.csv'} "$log"
""")
    ncu.run("softmax", FIXTURES / "record_gpu.py", "S1", ncu=exe, gpu="GPU-3f2a")
    ncu.run("softmax", FIXTURES / "record_gpu.py", "S1", ncu=exe)
    assert seen.read_text().splitlines()[0] == "GPU-3f2a"
    assert seen.read_text().splitlines()[1] == os.environ.get("CUDA_VISIBLE_DEVICES", "unset")


def test_run_reports_permission_failure(tmp_path):
    exe = _fake_ncu(tmp_path, 'echo "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission"; exit 1\n')
    with pytest.raises(ncu.NcuError, match="may not read the GPU performance counters"):
        ncu.run("softmax", FIXTURES / "record_gpu.py", "S1", ncu=exe)


# -- roofline, rules, deltas -----------------------------------------------------------------------------------------


def test_classify_bounds():
    n = 4096 * 4096
    mem = classify(5 * n, 8 * n, 0.0367, peaks=H200)  # the seed at S1 on the H200
    assert mem["bound"] == "memory" and mem["limit"] == "memory"
    assert mem["tb_s"] == pytest.approx(8 * n / 0.0367e-3 / 1e12)
    assert 0.8 < mem["fraction"] < 0.9 and mem["hard_fraction"] < mem["fraction"]
    comp = classify(2 * 8192**3, 3 * 2 * 8192**2, 2.0, peaks=H200)  # bf16 matmul 8192^3 at 550 TFLOP/s
    assert comp["bound"] == "compute" and comp["intensity"] > comp["ridge"]
    lat = classify(5 * n, 8 * n, 0.5, peaks=H200)
    assert lat["bound"] == "latency" and lat["fraction"] < 0.3
    launch = classify(5 * 1024, 8 * 1024, 0.004, peaks=H200)
    assert launch["bound"] == "launch"
    eager = classify(5 * n, 8 * n, 0.2, wall_ms=0.9, peaks=H200)
    assert eager["bound"] == "launch" and "eager wall time" in eager["reason"]


def _profile(ms=0.1, **over):
    base = {
        "shapes": [{"name": "S1", "ms": ms, "calls": 5,
                    "roofline": classify(5 * 4096 * 4096, 8 * 4096 * 4096, ms, peaks=H200),
                    "kernels": [{"name": "k", "kind": "kernel", "calls": 5, "grid": [64, 1, 1]}]}],
        "compile": [{"kernel": "k", "regs": 255, "spills": 12}],
        "ncu": {"rows": [{"kernel": "k", "metrics": {"occupancy_pct": 6.0, "theoretical_occupancy_pct": 12.5,
                                                     "grid": 64, "local_ld": 100, "dram_pct": 20, "sm_pct": 10,
                                                     "stall_top": [{"reason": "long_scoreboard", "cycles": 30.0}]}}]},
    }
    base.update(over)
    return base


def test_rules_flag_each_bottleneck_once():
    found = advise(_profile(), sms=132)
    rules = [f["rule"] for f in found]
    assert rules.count("grid-smaller-than-sms") == 1
    assert "register-spills" in rules and rules.count("register-spills") == 1
    assert "low-occupancy" in rules and "far-from-roofline" in rules and "stalls" in rules
    grid = next(f for f in found if f["rule"] == "grid-smaller-than-sms")
    assert "64 blocks on 132 SMs" in grid["message"]
    occ = next(f for f in found if f["rule"] == "low-occupancy")
    assert "6%" in occ["message"] and "theoretical 12%" in occ["message"]
    assert [f["severity"] for f in found] == sorted([f["severity"] for f in found], key={"warn": 0, "info": 1}.get)


def test_stalls_rule_names_l2_and_stays_quiet_when_l2_is_the_busy_unit():
    """A kernel that round-trips data through L2 (split-K partials) can have DRAM and SM idle and still be bound:
    the stalls finding names L2 beside DRAM and SM, and is not raised when L2 is busy."""
    metrics = _profile()["ncu"]["rows"][0]["metrics"]
    quiet = [f["message"] for f in advise(_profile()) if f["rule"] == "stalls"]
    assert quiet == ["k: DRAM 20%, SM 10% busy; top warp stalls (cycles/issue): long_scoreboard 30.0"]
    with_l2 = _profile(ncu={"rows": [{"kernel": "k", "metrics": {**metrics, "l2_pct": 25.0}}]})
    assert [f["message"] for f in advise(with_l2) if f["rule"] == "stalls"] == [
        "k: DRAM 20%, L2 25%, SM 10% busy; top warp stalls (cycles/issue): long_scoreboard 30.0"]
    l2_bound = _profile(ncu={"rows": [{"kernel": "k", "metrics": {**metrics, "l2_pct": 85.0}}]})
    assert not [f for f in advise(l2_bound) if f["rule"] == "stalls"]


def test_rules_quiet_on_a_healthy_profile():
    healthy = {"shapes": [{"name": "S1", "ms": 0.0367, "calls": 5,
                           "roofline": classify(5 * 4096 * 4096, 8 * 4096 * 4096, 0.0367, peaks=H200),
                           "kernels": [{"name": "k", "kind": "kernel", "calls": 5, "grid": [4096, 1, 1]}]}],
               "compile": [{"kernel": "k", "regs": 54, "spills": 0}]}
    assert advise(healthy) == []
    assert advise({}) == []


def test_deltas_read_like_a_person_wrote_them():
    old = _profile(ms=0.5)
    new = _profile(compile=[{"kernel": "k", "regs": 96, "spills": 0}],
                   ncu={"rows": [{"kernel": "k", "metrics": {"occupancy_pct": 38.0, "grid": 4096,
                                                             "dram_pct": 20.2}}]})
    roof = classify(5 * 4096 * 4096, 8 * 4096 * 4096, 0.04, peaks=H200)
    new["shapes"] = [{**old["shapes"][0], "ms": 0.04, "roofline": roof}]
    lines = diff(old, new)
    assert "k: occupancy 6% -> 38%" in lines
    assert "k: registers/thread 255 -> 96" in lines and "k: spills 12 -> 0" in lines
    assert "S1: time 0.5 ms -> 0.04 ms" in lines
    assert "S1: latency-bound -> memory-bound" in lines
    assert not any("DRAM" in ln for ln in lines), "a 1% change is noise"
    assert diff({}, new) == []


def test_summary_build_and_format():
    from workbench.tasks import load_task

    task = load_task("softmax")
    rows = [{"name": "S1", "role": "public", "ms": 0.0367, "wall_ms": 0.08,
             "profile": {"calls": 5, "kernel_ms": 0.0336, "event_vs_kernel": 1.09,
                         "kernels": kernel_table(attribute(events("torch_events_seed_S1.json")))}},
            {"name": "S2", "role": "public", "ms": None}]
    profile = summary.build(task, rows, [{"kernel": "_softmax_tile", "regs": 54, "spills": 0, "shared": 16,
                                          "num_warps": 4, "num_stages": 3}], 132, "NVIDIA H200")
    assert [s["name"] for s in profile["shapes"]] == ["S1"]
    assert "H200: 4.8 TB/s" in profile["source"] and "measured" in profile["source"]
    assert profile["shapes"][0]["roofline"]["bound"] == "memory"
    assert profile["findings"] == []
    text = "\n".join(summary.format_profile(profile))
    assert "S1: 0.0367 ms, memory-bound" in text and "_softmax_tile" in text and "54 regs/thread" in text
    json.dumps(profile)


def test_drive_refuses_unknown_shape(capsys):
    from workbench.profiler import drive

    assert drive.main(["--task", "softmax", "--file", os.devnull, "--shape", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


# -- compute-sanitizer (optional pass over a new best) ---------------------------------------------------------------


def test_sanitizer_parse_and_fake_run(tmp_path):
    from workbench.evaluator import sanitizer

    clean = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
    assert sanitizer.parse(clean) == {"errors": 0, "problems": []}
    dirty = ("========= COMPUTE-SANITIZER\n"
             "========= Invalid __global__ read of size 4 bytes\n"
             "=========     at _kernel+0x90\n"
             "========= ERROR SUMMARY: 1,024 errors\n")
    found = sanitizer.parse(dirty)
    assert found["errors"] == 1024 and found["problems"] == ["Invalid __global__ read of size 4 bytes"]
    assert sanitizer.parse("========= RACECHECK SUMMARY: 3 hazards displayed")["errors"] == 3
    with pytest.raises(sanitizer.SanitizerError, match="Device not supported"):
        sanitizer.parse("========= Error: Device not supported")
    with pytest.raises(sanitizer.SanitizerError, match="no error summary"):
        sanitizer.parse("")
    with pytest.raises(sanitizer.SanitizerError, match="unknown sanitizer tool"):
        sanitizer.run("softmax", "k.py", "S1", tool="bogus")
    exe = _fake_ncu(tmp_path, 'echo "tool=$2"; echo "========= ERROR SUMMARY: 2 errors"\n')
    result = sanitizer.run("softmax", tmp_path / "k.py", "S1", tool="racecheck", exe=exe)
    assert result["errors"] == 2 and result["tool"] == "racecheck" and "--tool racecheck" in result["command"]
    # the candidate's run failed: its "0 errors" checked nothing, so it is an error, not a clean result
    exe = _fake_ncu(tmp_path, 'echo "RuntimeError: CUDA out of memory" >&2; '
                              'echo "========= ERROR SUMMARY: 0 errors"; exit 1\n')
    with pytest.raises(sanitizer.SanitizerError, match="failed with exit status 1 .*CUDA out of memory"):
        sanitizer.run("softmax", tmp_path / "k.py", "S1", exe=exe)
    # a failed run with errors found keeps them (the error may be why it failed)
    exe = _fake_ncu(tmp_path, 'echo "========= ERROR SUMMARY: 3 errors"; exit 1\n')
    result = sanitizer.run("softmax", tmp_path / "k.py", "S1", exe=exe)
    assert result["errors"] == 3 and result["exit_status"] == 1


def test_outside_observer_judges_ncus_kernel_list(tmp_path):
    from workbench.profiler import ncu, observer

    kernel = tmp_path / "k.py"
    kernel.write_text("import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef _softmax_tile(x):\n"
                      "    pass\n\n\ndef forward(x):\n    return x\n")
    seen = {}

    def runner(task, file, shape, *, metrics, timeout_s, gpu):
        seen.update(task=task, shape=shape, metrics=metrics, gpu=gpu)
        return {"rows": [{"kernel": "_softmax_tile", "launches": 1, "metrics": {}},
                         {"kernel": "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
                          "launches": 1, "metrics": {}}]}

    found = observer.check("softmax", kernel, "S1", gpu="GPU-3f2a", runner=runner)
    assert seen == {"task": "softmax", "shape": "S1", "metrics": [observer.DURATION_METRIC], "gpu": "GPU-3f2a"}
    assert found["kernels"][0] == "_softmax_tile" and found["problems"] == []

    def foreign(task, file, shape, *, metrics, timeout_s, gpu):
        return {"rows": [{"kernel": "_softmax_tile"}, {"kernel": "sm90_xmma_gemm_bf16bf16_bf16f32"}]}

    found = observer.check("softmax", kernel, "S1", runner=foreign)
    assert len(found["problems"]) == 1 and "sm90_xmma_gemm" in found["problems"][0]

    with pytest.raises(ncu.NcuError, match="no kernels"):
        observer.check("softmax", kernel, "S1", runner=lambda *a, **k: {"rows": []})
