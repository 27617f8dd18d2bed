"""GPU sweep of mla_splitkv variants: correctness per variant in its own process, then graph timing at M1-M4.

One device call: every variant (a dict of CONFIG overrides, passed per call, so the shipped CONFIG is never
edited) is checked in a subprocess of its own on M1-M4 and the held-out shapes against the float64 oracle, with
NaN in the cache rows past each length and, at forced split counts, in every scratch buffer, and replayed from a
CUDA graph at M1, M3 and H1 (PDL must capture and still wait for stage 1); a variant that fails
or crashes (illegal address, compile error, timeout) is a recorded result. The passing ones and the torch baseline
are then timed per shape as CUDA-graph replays over rotated buffers with mla_bench's own time_graphs, split counts
are swept at B=1 for the best few, torch.profiler splits the best few into per-kernel device time at M1 and M3, and
the compiled stage-1 kernels' registers, spills and shared memory are listed. Writes $OUT/mla_variants.json and
prints a table last; nothing else is written (the device returns few files).

Run: PYTHONPATH=. python benchmarks/mla_variants.py [--only a,b] [--jobs 6] [--dry-run]
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch


def _load_bench():
    """mla_bench by path (benchmarks/ is not a package); it brings the task modules and the timing helpers."""
    spec = importlib.util.spec_from_file_location("mla_bench", Path(__file__).resolve().parent / "mla_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _load_bench()
REF, BASE, OURS, TASK, TOL = BENCH.REF, BENCH.BASE, BENCH.OURS, BENCH.TASK, BENCH.TOL

VARIANTS = {
    # name: (CONFIG overrides, why it is here). The shipped CONFIG has run stage 1 in Gluon since session 4
    # (2026-11-30); the tl stage-1 variants name STAGE1 "triton" explicitly.
    "gluon": ({}, "the shipped CONFIG: stage 1 in Gluon, a TMA loader warp, a scoring warpgroup that hands p to "
                  "a second warpgroup for the other half of the value columns"),
    "gluon-fused": ({"MERGE": "fused"}, "Gluon stage 1 that merges its own splits after a barrier per (batch row, "
                                        "head group) under a cooperative launch: no stage-2 kernel, no second launch"),
    "gluon-kernel": ({"MERGE": "kernel"}, "Gluon stage 1, stage 2 always a kernel of its own (session 4)"),
    "gluon-n32": ({"BLOCK_N": 32, "num_stages": 4}, "Gluon stage 1 on 32-row tiles, 4 deep: at M1 a program's "
                                                    "one 64-row tile becomes two, the second landing during the "
                                                    "first's math"),
    "gluon-n32-fused": ({"BLOCK_N": 32, "num_stages": 4, "MERGE": "fused"}, "both of the above"),
    "gluon-lsu-store": ({"STORE": "lsu"}, "Gluon stage 1 writes o (partials or final) with 16-byte stores from "
                                          "every thread, not by TMA from its staging buffer (shipped until session 6)"),
    "gluon-lsu-store-fused": ({"STORE": "lsu", "MERGE": "fused"}, "both of the above"),
    "gluon-pdl": ({"PDL": True}, "Gluon stage 1 releases stage 2 early (griddepcontrol.launch_dependents after its "
                                 "loads are issued); stage 2 waits in griddepcontrol.wait, so its launch is hidden"),
    "tma": ({"STAGE1": "triton"}, "the tl stage 1 with full tiles by TMA (255 regs, 0 spills, 216 KB), shipped "
                                  "before the Gluon kernel"),
    "base": ({"STAGE1": "triton", "LOAD": "masked"}, "the first tl default (masked loads)"),
    "tma-pdl": ({"STAGE1": "triton", "PDL": True},
                "tl stage 1, stage 2 as a programmatic dependent launch: launch + lengths load overlap stage 1"),
    "tma-mh8": ({"STAGE1": "triton", "MERGE_HEADS": 8}, "tl stage 1 with the multi-row merge"),
}
FORCED_SPLITS = (1, 4, 64)
"""Split counts checked with NaN scratch on ragged shapes: single pass, few, and many mostly-empty splits."""
SPLIT_SWEEP = (16, 32, 64, 128)


def _shapes() -> list[tuple[str, dict]]:
    return ([(s["name"], s["params"]) for s in TASK["shapes"]["cuda"]]
            + [(s["name"], s["params"]) for s in TASK["shapes"]["heldout"]])


def _poison_tail(inputs: dict) -> None:
    """NaN in every cache row at or past its length: the contract says such rows may hold anything."""
    kv, lens = inputs["kv_cache"], inputs["cache_seqlens"]
    rows = torch.arange(kv.shape[1], device=kv.device)[None, :] >= lens.to(torch.int64)[:, None]
    kv[rows] = float("nan")


def _err(o, lse, ref) -> tuple[float, float, bool]:
    e_o, e_l = BENCH.rel_rms(o, ref[0]), BENCH.rel_rms(lse, ref[1])
    return e_o, e_l, e_o <= TOL["o"] and e_l <= TOL["lse"]


def stage1_kernels() -> list[dict]:
    """Registers, spills and shared memory of every stage-1 kernel compiled in this process."""
    rows = []
    # The interpreter keeps no compiled kernels (and no device_caches): nothing to report there.
    kernels = [OURS._mla_split_attend, OURS._mla_split_attend_ws]
    for caches in (c for k in kernels for c in getattr(k, "device_caches", {}).values()):
        for kernel in caches[0].values():
            try:
                if hasattr(kernel, "_init_handles"):
                    kernel._init_handles()
                src = getattr(kernel, "src", None)
                arg_names = getattr(getattr(src, "fn", None), "arg_names", [])
                consts = {}
                # ASTSource keys constexprs by argument-index tuples; map them back to names for the report.
                for key, value in (getattr(src, "constants", {}) or {}).items():
                    if isinstance(key, tuple) and len(key) == 1 and key[0] < len(arg_names):
                        key = arg_names[key[0]]
                    if isinstance(value, (int, bool, str)):
                        consts[str(key)] = value
                meta = kernel.metadata
                rows.append({"n_regs": kernel.n_regs, "n_spills": kernel.n_spills, "shared": meta.shared,
                             "num_warps": meta.num_warps, "num_stages": meta.num_stages,
                             "const": consts})
            except Exception as exc:  # attribute names move between Triton versions: record, don't crash
                rows.append({"error": repr(exc)[:200]})
    return rows


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _graph_check(fwd, inputs: dict, ref, sname: str) -> dict:
    """The call captured in a CUDA graph and replayed over NaN-filled outputs: PDL launches must capture, and a
    merge that read partials before stage 1 finished would show here, where nothing serialises the two."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o, lse = fwd(**inputs)
        for _ in range(3):
            o.fill_(float("nan"))
            lse.fill_(float("nan"))
            graph.replay()
        torch.cuda.synchronize()
        e_o, e_l, ok = _err(o, lse, ref)
        return {"shape": f"{sname}/graph", "err_o": e_o, "err_lse": e_l, "ok": ok}
    except Exception as exc:  # a capture failure is this variant's result, not the sweep's end
        return {"shape": f"{sname}/graph", "err_o": float("inf"), "err_lse": float("inf"), "ok": False,
                "error": repr(exc)[:300]}


def check_variant(name: str, device: str = "cuda", shapes: list[tuple[str, dict]] | None = None,
                  forced_on: tuple[str, ...] = ("H1", "H5", "H2"),
                  graph_on: tuple[str, ...] = ("M1", "M3", "H1")) -> dict:
    """Child process: the variant on every cuda and held-out shape, then forced splits with NaN scratch.

    device and shapes exist for the CPU test, which runs the same checks on the interpreter's small shapes.
    """
    cfg = VARIANTS[name][0]
    fwd = lambda **kw: OURS.forward(**kw, config=cfg)  # noqa: E731
    shapes = shapes if shapes is not None else _shapes()
    rows, t0 = [], time.time()
    for sname, params in shapes:
        inputs = REF.make_inputs(params, 0, device)
        ref = REF.forward(**inputs)
        _poison_tail(inputs)
        # Stale results in the blocks the allocator hands out next expose outputs the kernel never writes.
        fwd(**REF.make_inputs(params, 100, device))
        o, lse = fwd(**inputs)
        _sync(device)
        e_o, e_l, ok = _err(o, lse, ref)
        ok = ok and o.dtype == inputs["q"].dtype and lse.dtype == torch.float32
        rows.append({"shape": sname, "err_o": e_o, "err_lse": e_l, "ok": ok})
        if device == "cuda" and sname in graph_on:
            rows.append(_graph_check(fwd, inputs, ref, sname))
        del inputs, ref, o, lse
    for sname in forced_on:
        params = next(p for n, p in shapes if n == sname)
        inputs = REF.make_inputs(params, 7, device)
        ref = REF.forward(**inputs)
        _poison_tail(inputs)
        for forced in FORCED_SPLITS:
            splits, o, lse = BENCH.forced_split_run(inputs, forced, cfg)
            _sync(device)
            e_o, e_l, ok = _err(o, lse, ref)
            rows.append({"shape": f"{sname}/S={splits}", "err_o": e_o, "err_lse": e_l, "ok": ok})
    return {"variant": name, "ok": all(r["ok"] for r in rows), "checks": rows, "kernels": stage1_kernels(),
            "seconds": time.time() - t0}


def run_checks(names: list[str], jobs: int, timeout: float) -> dict:
    """Each variant's check in its own process, a few at once (compiles are CPU-bound, the GPU is mostly idle)."""
    def one(name: str) -> dict:
        cmd = [sys.executable, __file__, "--check-one", name]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"variant": name, "ok": False, "error": f"timeout after {timeout:.0f} s"}
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {"variant": name, "ok": False, "error": f"rc={proc.returncode}: {tail[:300]}"}
        return json.loads(lines[-1])

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return {r["variant"]: r for r in pool.map(one, names)}


def _fn(cfg: dict, num_splits: int = 0):
    return lambda **kw: OURS.forward(**kw, num_splits=num_splits, config=cfg)


def timing(names: list[str], blocks: int) -> list[dict]:
    """Every passing variant and the torch baseline per cuda shape, one graph each over the same rotated sets."""
    rows = []
    for shape in TASK["shapes"]["cuda"]:
        params = shape["params"]
        sets = BENCH._input_sets(params, BENCH.rotation(params))
        graphs, errors = {}, {}
        for name in ["torch"] + names:
            try:
                fn = BASE.forward if name == "torch" else _fn(VARIANTS[name][0])
                graphs[name] = BENCH.graph_of(fn, sets)
            except Exception as exc:  # one variant failing to capture must not cost the others their numbers
                errors[name] = repr(exc)[:200]
        times = BENCH.time_graphs(graphs, len(sets), blocks=blocks)
        _, nbytes = BENCH.roofline(params)
        for name in ["torch"] + names:
            row = {"shape": shape["name"], "variant": name, "buffers": len(sets)}
            if name in times:
                t = times[name]["median_us"]
                row.update(us=t, minmax=[times[name]["min_us"], times[name]["max_us"]],
                           tbps=nbytes / (t * 1e-6) / 1e12)
                if name != "torch":
                    row["splits"] = OURS.split_plan(params["B"], params["H"], params["N"], torch.device("cuda"),
                                                    config=VARIANTS[name][0])[0]
            else:
                row["error"] = errors.get(name, "not timed")
            rows.append(row)
        del graphs, sets
        torch.cuda.empty_cache()
        print(f"timed {shape['name']}: " + ", ".join(f"{r['variant']} {r['us']:.1f}" for r in rows
                                                      if r["shape"] == shape["name"] and "us" in r), flush=True)
    return rows


def split_sweep(names: list[str], blocks: int) -> list[dict]:
    """Forced split counts at B=1 for a few variants: the auto plan's one-program-per-SM guess, tested."""
    rows = []
    by_name = {s["name"]: s["params"] for s in TASK["shapes"]["cuda"]}
    for sname in ("M1", "M2"):
        params = by_name[sname]
        sets = BENCH._input_sets(params, BENCH.rotation(params))
        graphs = {}
        for name in names:
            for forced in SPLIT_SWEEP:
                try:
                    graphs[(name, forced)] = BENCH.graph_of(_fn(VARIANTS[name][0], forced), sets)
                except Exception as exc:
                    rows.append({"shape": sname, "variant": name, "splits": forced, "error": repr(exc)[:200]})
        for (name, forced), r in BENCH.time_graphs(graphs, len(sets), blocks=blocks).items():
            rows.append({"shape": sname, "variant": name, "splits": forced, "us": r["median_us"]})
        del graphs, sets
        torch.cuda.empty_cache()
    return rows


def profile(names: list[str], calls: int = 30) -> list[dict]:
    """Device time per kernel (stage 1, stage 2) at M1 and M3 from torch.profiler over eager calls."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    rows = []
    by_name = {s["name"]: s["params"] for s in TASK["shapes"]["cuda"]}
    for sname in ("M1", "M3"):
        params = by_name[sname]
        sets = BENCH._input_sets(params, BENCH.rotation(params))
        for name in names:
            fn = _fn(VARIANTS[name][0])
            for inputs in sets:
                fn(**inputs)
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for i in range(calls):
                    fn(**sets[i % len(sets)])
                torch.cuda.synchronize()
            kernels = {}
            for evt in prof.key_averages():
                if "_mla_" in evt.key:
                    total = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0.0)
                    kernels[evt.key] = {"avg_us": total / max(evt.count, 1), "count": evt.count}
            rows.append({"shape": sname, "variant": name, "kernels": kernels})
        del sets
        torch.cuda.empty_cache()
    return rows


def _best(rows: list[dict], shape: str, k: int) -> list[str]:
    timed = sorted((r for r in rows if r["shape"] == shape and "us" in r and r["variant"] != "torch"),
                   key=lambda r: r["us"])
    return [r["variant"] for r in timed[:k]]


def print_report(result: dict) -> None:
    checks = result["checks"]
    print("\n== correctness per variant (worst rel_rms over cuda + held-out + forced splits; tol o %.1e lse %.1e)"
          % (TOL["o"], TOL["lse"]))
    for name, c in checks.items():
        if "checks" in c:
            worst_o = max(r["err_o"] for r in c["checks"])
            worst_l = max(r["err_lse"] for r in c["checks"])
            bad = [r["shape"] for r in c["checks"] if not r["ok"]]
            kern = ", ".join(f"H{k['const'].get('BLOCK_H', '?')}/S{int(bool(k['const'].get('SINGLE')))}: "
                             f"{k.get('n_regs')}r {k.get('n_spills')}sp {k.get('shared', 0) // 1024}K"
                             for k in c["kernels"] if "error" not in k)
            print(f"  {name:13s} {'ok  ' if c['ok'] else 'FAIL'} o {worst_o:.2e} lse {worst_l:.2e} "
                  f"{c['seconds']:5.1f}s  {kern}" + (f"  failing: {bad}" if bad else ""))
        else:
            print(f"  {name:13s} ERROR {c['error']}")
    shapes = [s["name"] for s in TASK["shapes"]["cuda"]]
    print(f"\n== graph us per call (rotated buffers), TB/s in brackets; copy {result['copy_tbps']:.2f} TB/s")
    print(f"{'variant':13s} " + " ".join(f"{s:>16s}" for s in shapes))
    for name in ["torch"] + list(checks):
        cells = []
        for s in shapes:
            r = next((r for r in result["timing"] if r["shape"] == s and r["variant"] == name), None)
            cells.append(f"{r['us']:8.2f} ({r['tbps']:4.2f})" + (f"{r['splits']:>3d}" if "splits" in r else "   ")
                         if r and "us" in r else f"{'-':>16s}")
        print(f"{name:13s} " + " ".join(f"{c:>16s}" for c in cells))
    if result.get("splits"):
        print("\n== forced splits at B=1 (graph us)")
        for r in result["splits"]:
            print(f"  {r['shape']} {r['variant']:13s} S={r['splits']:<4d} " + (f"{r['us']:8.2f}" if "us" in r
                                                                               else r["error"]))
    for r in result.get("profile", []):
        print(f"  profile {r['shape']} {r['variant']:13s} "
              + ", ".join(f"{k.split('_mla_')[-1][:14]} {v['avg_us']:.2f} us" for k, v in r["kernels"].items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    parser.add_argument("--jobs", type=int, default=8, help="variant checks run at once")
    parser.add_argument("--check-timeout", type=float, default=240.0, help="seconds per variant check")
    parser.add_argument("--blocks", type=int, default=5, help="interleaved timing blocks per shape")
    parser.add_argument("--skip-profile", action="store_true")
    parser.add_argument("--skip-splits", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="validate and list the variants, then exit")
    parser.add_argument("--check-one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"mla_variants: unknown variant(s) {unknown}; known: {list(VARIANTS)}", file=sys.stderr)
        return 2
    for name in names:
        OURS.resolve(VARIANTS[name][0])  # a typo in a key fails here, not minutes into the device run
    if args.dry_run:
        for name in names:
            print(f"{name:13s} {json.dumps(VARIANTS[name][0]):60s} {VARIANTS[name][1]}")
        return 0
    if not torch.cuda.is_available():
        print("mla_variants: needs a CUDA GPU (use --dry-run to list variants)", file=sys.stderr)
        return 2
    if args.check_one:
        print(json.dumps(check_variant(args.check_one)), flush=True)
        return 0
    out_dir = Path(os.environ.get("OUT", "."))
    t_all = time.time()
    result = {"env": BENCH.environment(), "config": dict(OURS.CONFIG),
              "variants": {n: {"config": VARIANTS[n][0], "why": VARIANTS[n][1]} for n in names}}
    print(json.dumps(result["env"]), flush=True)
    result["copy_tbps"] = BENCH.copy_bandwidth()
    t0 = time.time()
    result["checks"] = run_checks(names, args.jobs, args.check_timeout)
    passing = [n for n in names if result["checks"][n].get("ok")]
    print(f"checks done in {time.time() - t0:.0f} s; passing: {passing}", flush=True)
    dump = lambda: (out_dir / "mla_variants.json").write_text(json.dumps(result, indent=1))  # noqa: E731
    dump()
    t0 = time.time()
    result["timing"] = timing(passing, args.blocks)
    print(f"timing done in {time.time() - t0:.0f} s", flush=True)
    dump()
    best_m1 = _best(result["timing"], "M1", 3)
    best_m3 = _best(result["timing"], "M3", 3)
    if not args.skip_splits:
        # The shipped CONFIG and PDL always: does PDL make fewer, fuller splits (less partial traffic) pay at M1?
        pick = list(dict.fromkeys([n for n in ("gluon", "tma") if n in passing] + best_m1))[:4]
        result["splits"] = split_sweep(pick, max(3, args.blocks - 2))
        dump()
    if not args.skip_profile:
        pick = list(dict.fromkeys([n for n in ("gluon", "tma") if n in passing] + best_m1 + best_m3))
        result["profile"] = profile(pick)
    result["env_after"] = BENCH.environment()
    result["seconds"] = time.time() - t_all
    dump()
    print_report(result)
    print(f"\nclocks before/after: {result['env']['nvidia_smi']} / {result['env_after']['nvidia_smi']}; "
          f"total {result['seconds']:.0f} s")
    return 0 if "gluon" not in names or result["checks"]["gluon"].get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
