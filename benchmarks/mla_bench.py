"""GPU benchmark for MLA decode: correctness on every task shape, then our kernel against the bf16 baseline.

One script for one device call: it checks ours, the seed and the baseline against the float64 oracle on M1-M4
and the held-out shapes (ours also at forced split counts, with NaN-filled scratch), then times ours and the
baseline interleaved per shape as CUDA-graph replays over rotated cache buffers (so M1's 9.6 MB cache cannot sit
in L2) and as eager wall time, sweeps split counts at B=1 and tile configs at M3, prints a table last and writes
everything to $OUT/mla_bench.json.

Run: PYTHONPATH=. python benchmarks/mla_bench.py [--tune] [--quick] [--skip-sweeps]
"""

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import torch
import triton

TASK_DIR = Path(__file__).resolve().parent.parent / "kernels" / "mla_decode"
ROTATE_BYTES = 256 << 20
"""Rotate input sets until they span this much memory: over 4x the H200's ~60 MB L2."""


def _load(name: str):
    """Import a task file by path: kernels/ is a folder of task folders, not a package."""
    spec = importlib.util.spec_from_file_location(f"mla_{name}", TASK_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REF, BASE, OURS, SEED = (_load(n) for n in ("reference", "baseline", "mla_splitkv", "seed"))
TASK = tomllib.loads((TASK_DIR / "task.toml").read_text())
TOL = TASK["tolerance"]["per_output"]


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The task's metric; NaN or inf anywhere counts as infinitely wrong."""
    out = out.double()
    if not torch.isfinite(out).all():
        return math.inf
    ref = ref.double()
    return ((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def check(name: str, fn, inputs: dict, ref: tuple) -> dict:
    """Errors of one implementation on one input set, and whether both outputs pass the task's tolerances."""
    o, lse = fn(**inputs)
    torch.cuda.synchronize()
    e_o, e_l = rel_rms(o, ref[0]), rel_rms(lse, ref[1])
    return {"impl": name, "err_o": e_o, "err_lse": e_l, "ok": e_o <= TOL["o"] and e_l <= TOL["lse"],
            "dtype_ok": o.dtype == inputs["q"].dtype and lse.dtype == torch.float32}


def correctness(quick: bool) -> list[dict]:
    """Ours, seed and baseline on every cuda and held-out shape; ours also at forced split counts."""
    rows = []
    shapes = [("cuda", s) for s in TASK["shapes"]["cuda"]] + [("heldout", s) for s in TASK["shapes"]["heldout"]]
    for kind, shape in shapes:
        for seed in (0,) if quick else (0, 1):
            inputs = REF.make_inputs(shape["params"], seed, "cuda")
            ref = REF.forward(**inputs)
            # A call on other data first leaves stale results in the blocks the allocator hands out next, so
            # an output element the kernel forgets to write shows up as an error.
            OURS.forward(**REF.make_inputs(shape["params"], seed + 100, "cuda"))
            impls = [("ours", OURS.forward), ("baseline", BASE.forward)]
            if seed == 0:
                impls.append(("seed", SEED.forward))
            for name, fn in impls:
                row = check(name, fn, inputs, ref)
                row.update(shape=shape["name"], kind=kind, seed=seed)
                rows.append(row)
            del inputs, ref
    # Forced split counts on ragged shapes, with NaN scratch: empty splits must never reach the merge.
    for sname in ("H1", "H5", "H2"):
        shape = next(s for s in TASK["shapes"]["heldout"] if s["name"] == sname)
        inputs = REF.make_inputs(shape["params"], 7, "cuda")
        ref = REF.forward(**inputs)
        for forced in (1, 2, 4, 16, 64, 128):
            splits, o, lse = forced_split_run(inputs, forced)
            torch.cuda.synchronize()
            e_o, e_l = rel_rms(o, ref[0]), rel_rms(lse, ref[1])
            rows.append({"impl": f"ours(S={splits})", "shape": sname, "kind": "forced", "seed": 7, "err_o": e_o,
                         "err_lse": e_l, "ok": e_o <= TOL["o"] and e_l <= TOL["lse"], "dtype_ok": True})
    return rows


def forced_split_run(inputs: dict, forced: int, config: dict | None = None) -> tuple:
    """Our kernel at a forced split count, into NaN-filled outputs and scratch (attend_into), as (splits, o, lse):
    an element never written, or an empty split's scratch merged, then shows as NaN. Paged caches included."""
    q, kv, table = inputs["q"], inputs["kv_cache"], inputs.get("block_table")
    b, h, _ = q.shape
    n = kv.shape[1] if table is None else table.shape[1] * kv.shape[1]
    splits, split_len = OURS.split_plan(b, h, n, q.device, forced, config=config)
    o = torch.full((b, h, 512), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((b, h), float("nan"), device=q.device)
    op, lp = OURS.partial_buffers(b, h, splits, q.device, q.dtype)
    op.fill_(float("nan"))
    lp.fill_(float("nan"))
    OURS.attend_into(**inputs, o=o, lse=lse, o_part=op, lse_part=lp, splits=splits, split_len=split_len,
                     config=config)
    return splits, o, lse


def _input_sets(params: dict, count: int) -> list[dict]:
    return [REF.make_inputs(params, 1000 + i, "cuda") for i in range(count)]


def rotation(params: dict) -> int:
    """How many distinct input sets make the timed loop stream from HBM rather than L2."""
    one = 2 * params["B"] * params["N"] * 576 + 2 * params["B"] * params["H"] * 576
    return max(2, min(16, math.ceil(ROTATE_BYTES / one)))


def graph_of(fn, sets: list[dict]) -> torch.cuda.CUDAGraph:
    """One graph holding a call on each input set in turn, after an eager warm-up (compiles, cuBLAS handles)."""
    for inputs in sets:
        fn(**inputs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for inputs in sets:
            fn(**inputs)
    graph.replay()
    torch.cuda.synchronize()
    return graph


def time_graphs(graphs: dict, calls_per_replay: int, blocks: int = 7, min_ms: float = 15.0) -> dict:
    """Median microseconds per call for each graph, interleaving blocks of replays so drift hits all alike."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per = {}
    for name, g in graphs.items():
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        per[name] = max(1, math.ceil(min_ms / max(start.elapsed_time(end), 1e-3)))
    samples = {name: [] for name in graphs}
    for _ in range(blocks):
        for name, g in graphs.items():
            start.record()
            for _ in range(per[name]):
                g.replay()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) * 1e3 / (per[name] * calls_per_replay))
    return {name: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v)}
            for name, v in samples.items()}


def time_eager(fns: dict, sets: list[dict], blocks: int = 7, calls: int = 60) -> dict:
    """Median wall microseconds per call of back-to-back eager calls, rotating inputs, synchronised per block."""
    samples = {name: [] for name in fns}
    for _ in range(blocks):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(calls):
                fn(**sets[i % len(sets)])
            torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - t0) * 1e6 / calls)
    return {name: statistics.median(v) for name, v in samples.items()}


def roofline(params: dict) -> tuple[float, float]:
    """(FLOPs, bytes) from the task's own formulas."""
    env = {k: v for k, v in params.items()}
    return (eval(TASK["roofline"]["flops"], {}, env), eval(TASK["roofline"]["bytes"], {}, env))


def timing(quick: bool) -> list[dict]:
    """Ours vs the baseline on M1-M4: graph replay with rotated buffers, and eager wall time."""
    rows = []
    for shape in TASK["shapes"]["cuda"]:
        params = shape["params"]
        sets = _input_sets(params, rotation(params))
        graphs = {"ours": graph_of(OURS.forward, sets), "baseline": graph_of(BASE.forward, sets)}
        g = time_graphs(graphs, len(sets), blocks=3 if quick else 7)
        del graphs
        eager = time_eager({"ours": OURS.forward, "baseline": BASE.forward}, sets, blocks=3 if quick else 7,
                           calls=max(len(sets), 40 if params["B"] < 8 else 8))
        flops, nbytes = roofline(params)
        splits, split_len = OURS.split_plan(params["B"], params["H"], params["N"], torch.device("cuda"))
        t = g["ours"]["median_us"]
        rows.append({
            "shape": shape["name"], "params": params, "buffers": len(sets), "splits": splits, "split_len": split_len,
            "ours_graph_us": t, "base_graph_us": g["baseline"]["median_us"],
            "ours_graph_minmax": [g["ours"]["min_us"], g["ours"]["max_us"]],
            "speedup_graph": g["baseline"]["median_us"] / t,
            "ours_eager_us": eager["ours"], "base_eager_us": eager["baseline"],
            "speedup_eager": eager["baseline"] / eager["ours"],
            "tbps": nbytes / (t * 1e-6) / 1e12, "tflops": flops / (t * 1e-6) / 1e12,
            "base_tbps": nbytes / (g["baseline"]["median_us"] * 1e-6) / 1e12,
        })
        del sets
        torch.cuda.empty_cache()
        print(f"timed {shape['name']}: ours {t:.1f} us, baseline {g['baseline']['median_us']:.1f} us", flush=True)
    return rows


CONFIGS = [(32, 3, False), (32, 4, False), (32, 4, True), (16, 6, False), (16, 8, False), (16, 8, True),
           (64, 2, False)]
"""(BLOCK_N, num_stages, LAZY_RESCALE) candidates that fit 227 KB of shared memory beside q's 72 KB."""


def config_sweep(quick: bool) -> list[dict]:
    """Stage-1 tile configs at M1 and M3 (graph over rotated sets), each with its error on one set."""
    rows = []
    saved = dict(OURS.CONFIG)
    by_name = {s["name"]: s["params"] for s in TASK["shapes"]["cuda"]}
    try:
        for sname in ("M3", "M1"):
            params = by_name[sname]
            sets = _input_sets(params, rotation(params))
            ref_o = REF.forward(**sets[0])[0]
            for block_n, stages, lazy in CONFIGS:
                OURS.CONFIG.update(BLOCK_N=block_n, num_stages=stages, LAZY_RESCALE=lazy)
                variant = {"BLOCK_N": block_n, "num_stages": stages, "LAZY_RESCALE": lazy}
                try:
                    graph = graph_of(OURS.forward, sets)
                    us = time_graphs({"v": graph}, len(sets), blocks=3)["v"]["median_us"]
                    err = rel_rms(OURS.forward(**sets[0])[0], ref_o)
                    rows.append({"sweep": "config", "shape": sname, "variant": variant, "us": us, "err_o": err})
                    del graph
                except Exception as exc:  # a config that does not fit (shared memory) is a result, not a crash
                    rows.append({"sweep": "config", "shape": sname, "variant": variant, "error": str(exc)[:200]})
                OURS.CONFIG.clear()
                OURS.CONFIG.update(saved)
            del sets, ref_o
            torch.cuda.empty_cache()
    finally:
        OURS.CONFIG.clear()
        OURS.CONFIG.update(saved)
    return rows


def best_config(rows: list[dict]) -> dict:
    """The fastest correct config at M3 (the bandwidth goal); M1 is reported beside it, not optimised."""
    ok = [r for r in rows if r["shape"] == "M3" and "us" in r and r["err_o"] <= TOL["o"]]
    return min(ok, key=lambda r: r["us"])["variant"] if ok else dict(OURS.CONFIG)


def split_sweep(quick: bool) -> list[dict]:
    """Forced split counts at B=1 (M1, M2) with the current config, as graphs over rotated sets."""
    rows = []
    by_name = {s["name"]: s["params"] for s in TASK["shapes"]["cuda"]}
    for sname in ("M1", "M2"):
        params = by_name[sname]
        sets = _input_sets(params, rotation(params))
        graphs = {}
        for forced in (0, 16, 32, 64, 128):
            graphs[f"S={forced or 'auto'}"] = graph_of(
                lambda forced=forced, **kw: OURS.forward(**kw, num_splits=forced), sets)
        for name, r in time_graphs(graphs, len(sets), blocks=3 if quick else 5).items():
            rows.append({"sweep": "splits", "shape": sname, "variant": name, "us": r["median_us"]})
        del graphs, sets
    return rows


def copy_bandwidth() -> float:
    """Device-to-device copy of 1 GiB, read plus write counted: the realistic HBM ceiling for this run."""
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    return 2 * src.numel() * 2 * 10 / (start.elapsed_time(end) * 1e-3) / 1e12


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    env = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
           "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        env["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,"
             "clocks_throttle_reasons.active", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        env["nvidia_smi"] = f"unavailable: {exc}"
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, fewer timing blocks")
    parser.add_argument("--skip-sweeps", action="store_true", help="no split-count sweep at B=1")
    parser.add_argument("--tune", action="store_true",
                        help="sweep stage-1 tile configs first and run everything else with the fastest at M3")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("mla_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    out_dir = Path(os.environ.get("OUT", "."))
    result = {"env": environment()}
    print(json.dumps(result["env"]), flush=True)
    result["copy_tbps"] = copy_bandwidth()
    if args.tune:
        t0 = time.time()
        result["config_sweep"] = config_sweep(args.quick)
        OURS.CONFIG.update(best_config(result["config_sweep"]))
        print(f"config sweep done in {time.time() - t0:.0f} s; using {OURS.CONFIG}", flush=True)
    result["config"] = dict(OURS.CONFIG)
    t0 = time.time()
    result["correctness"] = correctness(args.quick)
    print(f"correctness done in {time.time() - t0:.0f} s", flush=True)
    t0 = time.time()
    result["timing"] = timing(args.quick)
    print(f"timing done in {time.time() - t0:.0f} s", flush=True)
    if not args.skip_sweeps:
        t0 = time.time()
        result["sweeps"] = split_sweep(args.quick)
        print(f"split sweep done in {time.time() - t0:.0f} s", flush=True)
    result["env_after"] = environment()
    (out_dir / "mla_bench.json").write_text(json.dumps(result, indent=1))

    print("\n== correctness (rel_rms vs float64 oracle; tol o %.1e, lse %.1e)" % (TOL["o"], TOL["lse"]))
    bad = [r for r in result["correctness"] if not (r["ok"] and r["dtype_ok"])]
    for r in result["correctness"]:
        if r["seed"] in (0, 7):
            print(f"  {r['shape']:4s} {r['impl']:13s} o {r['err_o']:.2e} lse {r['err_lse']:.2e} "
                  f"{'ok' if r['ok'] and r['dtype_ok'] else 'FAIL'}")
    print(f"  {len(result['correctness']) - len(bad)}/{len(result['correctness'])} checks pass"
          + "".join(f"\n  FAIL {r}" for r in bad))
    for r in result.get("config_sweep", []) + result.get("sweeps", []):
        print(f"  sweep {r['shape']} {str(r['variant']):60s} "
              + (f"{r['us']:8.2f} us" if "us" in r else r.get("error", "")))
    print(f"  config used: {result['config']}; clocks before/after: {result['env']['nvidia_smi']} / "
          f"{result['env_after']['nvidia_smi']}")
    print(f"\n== {result['env']['gpu']}, torch {torch.__version__}, triton {triton.__version__}, "
          f"copy {result['copy_tbps']:.2f} TB/s; graph = CUDA-graph replay over rotated buffers, us per call")
    print(f"{'shape':5s} {'S':>4s} {'ours graph':>10s} {'base graph':>10s} {'x':>6s} {'ours eager':>10s} "
          f"{'base eager':>10s} {'x':>6s} {'TB/s':>6s} {'TFLOP/s':>7s}")
    for r in result["timing"]:
        print(f"{r['shape']:5s} {r['splits']:4d} {r['ours_graph_us']:10.2f} {r['base_graph_us']:10.2f} "
              f"{r['speedup_graph']:6.2f} {r['ours_eager_us']:10.2f} {r['base_eager_us']:10.2f} "
              f"{r['speedup_eager']:6.2f} {r['tbps']:6.2f} {r['tflops']:7.1f}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
