"""A user's eager decode loop at M1 (B=1 H=64 N=8192): 1000 calls of forward, then a sync, timed as wall us per call,
ours against another kernel file (--before DIR, main's), the two alternating for 15 rounds after 200 warm calls each.
Unlike mla_host.py, nothing else runs between the blocks. Then the same eager calls as the issue's independent
harness times them: triton's do_bench (L2 flushed before each call, CUDA events around it, median), with the plain
PyTorch form beside them. Run from the repo root on a CUDA machine: python3 benchmarks/mla_eager_loop.py --before
DIR (prints one JSON line)."""
import argparse
import importlib.util
import json
import pathlib
import statistics
import sys
import time

sys.path.insert(0, "kernels/mla_decode")
import torch  # noqa: E402
import triton  # noqa: E402

import baseline  # noqa: E402
import mla_splitkv as k  # noqa: E402
import reference  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a folder with the other mla_splitkv.py")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("before", pathlib.Path(args.before) / "mla_splitkv.py")
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    inp = reference.make_inputs({"B": 1, "H": 64, "N": 8192}, 0, "cuda")
    call = (inp["q"], inp["kv_cache"], inp["cache_seqlens"], inp["sm_scale"])
    impls = {"ours": lambda: k.forward(*call), "main": lambda: before.forward(*call)}
    seen = {name: [] for name in impls}
    for fn in impls.values():
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    for _ in range(15):
        for name, fn in impls.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(1000):
                fn()
            torch.cuda.synchronize()
            seen[name].append((time.perf_counter() - t0) * 1e3)  # ms per 1000 calls = us per call
    result = {name: {"median_us": round(statistics.median(v), 2), "min": round(min(v), 2), "max": round(max(v), 2)}
              for name, v in seen.items()}
    impls["plain"] = lambda: baseline.plain(*call)
    bench = {name: [] for name in impls}
    for _ in range(3):
        for name, fn in impls.items():
            bench[name].append(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3)
    result["do_bench_us"] = {name: round(statistics.median(v), 2) for name, v in bench.items()}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
