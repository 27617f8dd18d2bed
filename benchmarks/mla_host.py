"""Where an eager mla_splitkv call's time goes at M1 (B=1 H=64 N=8192) on a CUDA machine, for each place the Gluon
stage 1's TMA descriptors can be built (CONFIG DESC "auto", the default: on the device for eager calls, on the host
for graph captures; "host"), against main's kernel (--before DIR) and the baselines, in one process.

A lease's host can be twice as slow as another's, so every figure that is compared is measured interleaved: each
round runs one block of every implementation in turn, and the figure is the median over rounds. Per implementation:
host us per call (2000 back-to-back calls, no sync inside), wall us per call (40 calls then a sync: what a loop of
eager calls costs), GPU us per call (a CUDA graph of 20 calls replayed). Then the pieces of an auto call and a
cProfile of it. Triton's runner and launcher are reached through their internals here, as the kernel's raw launch
(_RawLaunch) reaches them.
Run from the repo root: python3 benchmarks/mla_host.py [--before DIR] (writes mla_host.json to $OUT, else here).
"""
import argparse
import cProfile
import dataclasses
import importlib.util
import io
import json
import os
import pathlib
import pstats
import statistics
import sys
import time

sys.path.insert(0, "kernels/mla_decode")
import torch  # noqa: E402
import triton  # noqa: E402

import baseline  # noqa: E402
import mla_splitkv as k  # noqa: E402
import reference  # noqa: E402


def block(fn, n: int, synced: bool) -> float:
    """us per call of n back-to-back calls; synced: the wall time including the GPU's (a sync inside the block)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    if synced:
        torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return us


def interleaved(fns: dict, n: int, synced: bool, rounds: int = 11) -> dict:
    """Median us per call of each fn, one block of each per round."""
    for fn in fns.values():
        block(fn, 50, synced)
    seen = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            seen[name].append(block(fn, n, synced))
    return {name: round(statistics.median(v), 2) for name, v in seen.items()}


def graph_us(fn, replays: int = 200, blocks: int = 7) -> float:
    """GPU time of one call: a graph of 20 calls replayed, us per call (median of blocks)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            fn()
    out = []
    for _ in range(blocks):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays // 20):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / replays)
    return round(statistics.median(out), 2)


def profile(fn, calls: int = 3000) -> list:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:14]
    return [[f"{pathlib.Path(f).name}:{line}({func})", round(tt * 1e6 / calls, 2), round(ct * 1e6 / calls, 2)]
            for (f, line, func), (cc, nc, tt, ct, _) in rows]


def with_desc(mode: str, fn):
    """fn under CONFIG DESC = mode (the plan key reads CONFIG, so each mode keeps plans of its own)."""
    def call():
        k.CONFIG["DESC"] = mode
        out = fn()
        k.CONFIG["DESC"] = "auto"
        return out
    return call


def runner_path(fn):
    """fn with a launch hook counted as set, so warm calls launch through Triton's runner (main's route)."""
    def call():
        k._hooks_idle = _busy
        out = fn()
        k._hooks_idle = _IDLE
        return out
    return call


_IDLE = k._hooks_idle


def _busy() -> bool:
    return False


def rel_rms(x, ref) -> float:
    return float(((x.float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="", help="a folder with main's mla_splitkv.py, timed as 'main'")
    args = parser.parse_args()
    inp = reference.make_inputs({"B": 1, "H": 64, "N": 8192}, 0, "cuda")
    q, kv, sl, scale = inp["q"], inp["kv_cache"], inp["cache_seqlens"], inp["sm_scale"]
    ref_o, ref_lse = reference.forward(**inp)
    impls = {"auto": lambda: k.forward(q, kv, sl, scale),
             "auto, runner": runner_path(lambda: k.forward(q, kv, sl, scale)),
             "host": with_desc("host", lambda: k.forward(q, kv, sl, scale))}
    if args.before:
        spec = importlib.util.spec_from_file_location("mla_before", pathlib.Path(args.before) / "mla_splitkv.py")
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
        impls["main"] = lambda: before.forward(q, kv, sl, scale)
    impls["compile"] = lambda: baseline.forward(q, kv, sl, scale)
    impls["plain"] = lambda: baseline.plain(q, kv, sl, scale)
    res = {"env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__},
           "errors": {}, "plans": {}}
    for name, fn in impls.items():
        fn()
        o, lse = fn()
        res["errors"][name] = {"o": rel_rms(o, ref_o), "lse": rel_rms(lse, ref_lse)}
    for mode in ("auto", "host"):
        k.CONFIG["DESC"] = mode
        plan = k._plan_for(q, kv, sl, None, 0, None)
        res["plans"][mode] = {"fused": plan.fused, "splits": plan.splits, "device_desc": plan.device_desc,
                              "ready": plan.ready, "direct": plan.direct,
                              "args": len(k._gluon_args(plan, (0, 0, 0), 0, None, 0.1, 0, 0, 0, 0, 0, False)),
                              "global_scratch_bytes": plan.compiled["gluon"].metadata.global_scratch_size}
    k.CONFIG["DESC"] = "auto"
    res["host_us"] = interleaved(impls, 2000, synced=False)
    res["wall_us"] = interleaved(impls, 40, synced=True, rounds=25)
    res["graph_us"] = {name: graph_us(impls[name]) for name in impls if name != "plain"}
    # The twin a capture made must not have replaced the eager path: auto's eager calls still build on the device.
    res["auto_after_capture_device_desc"] = k._plan_for(q, kv, sl, None, 0, None).device_desc
    plan = k._plan_for(q, kv, sl, None, 0, None)
    runner, raw = plan.runners["gluon"], plan.raw["gluon"]
    captured = {}
    plan.raw["gluon"] = dataclasses.replace(raw, launch=lambda *a: (captured.setdefault("args", a), raw.launch(*a)))
    impls["auto"]()
    plan.raw["gluon"] = raw
    head, largs = captured["args"][:13], captured["args"][13:]
    index = q.device.index
    shape_o, shape_l = (1, 64, 512), (1, 64)
    pieces = {
        "forward": lambda: k.forward(q, kv, sl, scale),
        "forward, runner (a hook set)": runner_path(lambda: k.forward(q, kv, sl, scale)),
        "raw launch alone (kept stream and scratch)": lambda: raw.launch(*head, *largs),
        "runner(*args) (CompiledKernel[grid], kept)": lambda: runner(*largs),
        "torch.empty o + lse": lambda: (torch.empty(1, 64, 512, dtype=torch.bfloat16, device=q.device),
                                        torch.empty(1, 64, dtype=torch.float32, device=q.device)),
        "torch.empty o + lse, shape tuples, device index": lambda: (
            torch.empty(shape_o, dtype=torch.bfloat16, device=index),
            torch.empty(shape_l, dtype=torch.float32, device=index)),
        "q.new_empty o + lse": lambda: (q.new_empty(shape_o), q.new_empty(shape_l, dtype=torch.float32)),
        "torch.empty_like o + lse (the plan's templates)": lambda: (torch.empty_like(plan.outputs_like[0]),
                                                                     torch.empty_like(plan.outputs_like[1])),
        "floor: two allocations like forward's, raw stream, raw launch": lambda: (
            torch.empty_like(plan.outputs_like[0]), torch.empty_like(plan.outputs_like[1]),
            raw.launch(*head[:3], torch._C._cuda_getCurrentRawStream(index), *head[4:], *largs)),
        "floor with torch.empty (session 29's)": lambda: (
            torch.empty(1, 64, 512, dtype=torch.bfloat16, device=q.device),
            torch.empty(1, 64, dtype=torch.float32, device=q.device),
            raw.launch(*head[:3], torch._C._cuda_getCurrentRawStream(index), *head[4:], *largs)),
        "_plan_for": lambda: k._plan_for(q, kv, sl, None, 0, None),
        "_hooks_idle()": k._hooks_idle,
        "torch.cuda.is_current_stream_capturing()": torch.cuda.is_current_stream_capturing,
        "raw stream (torch._C._cuda_getCurrentRawStream)": lambda: torch._C._cuda_getCurrentRawStream(index),
        "current_stream().cuda_stream": lambda: torch.cuda.current_stream().cuda_stream,
        "current_stream(index).cuda_stream": lambda: torch.cuda.current_stream(index).cuda_stream,
    }
    res["pieces_us"] = interleaved(pieces, 2000, synced=False, rounds=7)
    res["launch_hooks"] = [repr(triton.knobs.runtime.launch_enter_hook), repr(triton.knobs.runtime.launch_exit_hook)]
    res["cprofile_auto (own us, cumulative us per call)"] = profile(impls["auto"])
    pathlib.Path(os.environ.get("OUT", "."), "mla_host.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
