"""Where an eager mla_splitkv call's host time goes (M1: B=1 H=64 N=8192), piece by piece, on a CUDA machine.

Each item: median over 7 blocks of 2000 back-to-back calls (no sync inside a block), us per call; the full forward's
wall time per call with a sync per 40 calls, as RESULTS measures it. Triton's launcher is reached through its
internals here (a benchmark may; a candidate may not). Run from the repo root: python3 benchmarks/mla_host.py
(writes mla_host.json to $OUT, else the current folder).
"""
import json, statistics, sys, time
sys.path.insert(0, "kernels/mla_decode")
import torch
import reference, mla_splitkv as k

def per_call(fn, n=2000, blocks=7, synced=False, warm=200):
    """us per call, median of `blocks` blocks of n calls: host time (the sync after the clock stops), or with
    synced the wall time including the GPU's (the sync inside the timed block)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if synced:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return round(statistics.median(out), 2)


def wall(fn):
    return per_call(fn, n=40, blocks=25, synced=True, warm=50)


inp = reference.make_inputs({"B": 1, "H": 64, "N": 8192}, 0, "cuda")
q, kv, sl = inp["q"], inp["kv_cache"], inp["cache_seqlens"]
scale = inp["sm_scale"]
fwd = lambda: k.forward(q, kv, sl, scale)
o, lse = fwd(); fwd()
plan = k._plan_for(q, kv, sl, None, 0, None)
res = {"plan": {"gluon": plan.gluon, "fused": plan.fused, "splits": plan.splits, "launches": plan.launches,
                "ready": plan.ready, "tma_store": plan.tma_store}}
dev = q.device
t = {}
t["forward (host, no sync)"] = per_call(fwd)
t["forward wall (sync per 40)"] = wall(fwd)
t["torch.empty o"] = per_call(lambda: torch.empty(1, 64, 512, dtype=torch.bfloat16, device=dev))
t["torch.empty o + lse"] = per_call(lambda: (torch.empty(1, 64, 512, dtype=torch.bfloat16, device=dev),
                                            torch.empty(1, 64, dtype=torch.float32, device=dev)))
def one_buffer():
    b = torch.empty(64 * 512 * 2 + 64 * 4, dtype=torch.uint8, device=dev)
    return b[:65536].view(torch.bfloat16).view(1, 64, 512), b[65536:].view(torch.float32).view(1, 64)
t["one buffer + 2 views"] = per_call(one_buffer)
t["plan key"] = per_call(lambda: k._plan_key(q, kv, sl, None, 0, 0, None))
t["_plan_for"] = per_call(lambda: k._plan_for(q, kv, sl, None, 0, None))
t["data_ptr x5"] = per_call(lambda: (q.data_ptr(), kv.data_ptr(), sl.data_ptr(), o.data_ptr(), lse.data_ptr()))
t["q.device"] = per_call(lambda: q.device)
t["q.get_device()"] = per_call(lambda: q.get_device())
t["current_stream().cuda_stream"] = per_call(lambda: torch.cuda.current_stream().cuda_stream)
# the launch alone, as _run makes it, addresses throughout
args_holder = {}
orig = k._launch
def capture(plan_, name, kernel, grid, args, options):
    args_holder[name] = (grid, args)
    return orig(plan_, name, kernel, grid, args, options)
k._launch = capture
fwd()
k._launch = orig
name = "gluon" if plan.gluon else "tl"
grid, args = args_holder[name]
compiled = plan.compiled[name]
part = k._scratch(plan).data_ptr()
lpart = part + plan.batch * plan.heads * plan.splits * 512 * q.dtype.itemsize
t["_run (our arg building + launch)"] = per_call(lambda: k._run(plan, q.data_ptr(), kv.data_ptr(), sl.data_ptr(), None, scale, o.data_ptr(), lse.data_ptr(), part, lpart))
t["compiled[grid](*args)"] = per_call(lambda: compiled[grid](*args))
run, fn, packed = compiled.run, compiled.function, compiled.packed_metadata
stream = torch.cuda.current_stream().cuda_stream
t["compiled.run(...) direct, cached stream"] = per_call(lambda: run(grid[0], grid[1], grid[2], stream, fn, packed, None, None, None, *args))
t["compiled.run(...) direct, stream per call"] = per_call(lambda: run(grid[0], grid[1], grid[2], torch.cuda.current_stream().cuda_stream, fn, packed, None, None, None, *args))
launch = run.launch
t["launcher.launch (inner: descriptor expansion + C)"] = per_call(lambda: launch(grid[0], grid[1], grid[2], stream, fn, run.launch_cooperative_grid, run.launch_pdl, None, None, packed, None, None, None, *args))
cl = getattr(launch, "__closure__", None)
raw = None
if cl:
    for c in cl:
        if callable(c.cell_contents) and getattr(c.cell_contents, "__name__", "") == "launch":
            raw = c.cell_contents
if raw is not None:
    from triton.backends.nvidia.driver import make_tensordesc_arg
    idx = [i for i, a in enumerate(args) if hasattr(a, "block_shape")]
    res["descriptor args"] = len(idx)
    t["make_tensordesc_arg x descs (None meta)"] = per_call(lambda: [make_tensordesc_arg(args[i], None) for i in idx])
res["args"] = len(args)
res["us"] = t
res["o_ok"] = bool(torch.isfinite(o.float()).all())
import pathlib, os
pathlib.Path(os.environ.get("OUT", "."), "mla_host.json").write_text(json.dumps(res, indent=1))
print(json.dumps(res, indent=1))
