"""What an eager M1 call's raw launch costs, and why: the fused kernel launched cooperatively and plainly (an idle
GPU holds all 128 programs on its 132 SMs, so the plain launch cannot hang here), a 3-argument Triton kernel's raw
launch beside it, and the fused plan's eager wall and host time against the two-kernel plan's (MERGE "kernel").
Interleaved rounds, medians. Run from the repo root on a CUDA machine: python3 benchmarks/mla_launch_cost.py
(writes mla_launch_cost.json to $OUT, else here).
"""
import dataclasses
import json
import os
import pathlib
import sys

sys.path.insert(0, "kernels/mla_decode")
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import mla_splitkv as k  # noqa: E402
import reference  # noqa: E402
from mla_host import interleaved  # noqa: E402


@triton.jit
def _tiny(x, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)


def main() -> int:
    inp = reference.make_inputs({"B": 1, "H": 64, "N": 8192}, 0, "cuda")
    q, kv, sl, scale = inp["q"], inp["kv_cache"], inp["cache_seqlens"], inp["sm_scale"]
    ref_o, _ = reference.forward(**inp)
    two = {"MERGE": "kernel"}
    for _ in range(3):
        k.forward(q, kv, sl, scale)
        k.forward(q, kv, sl, scale, config=two)
    fused, split = k._plan_for(q, kv, sl, None, 0, None), k._plan_for(q, kv, sl, None, 0, two)
    o, _ = k.forward(q, kv, sl, scale, config=two)
    res = {"fused": [fused.fused, fused.direct], "two kernels": [split.fused, split.direct],
           "two kernels o err": float(((o.float() - ref_o).pow(2).mean().sqrt() / ref_o.pow(2).mean().sqrt()).item())}
    # One call's raw launch, recorded, to replay with and without the cooperative flag.
    raw, seen = fused.raw["gluon"], {}
    fused.raw["gluon"] = dataclasses.replace(raw, launch=lambda *a: (seen.setdefault("args", a), raw.launch(*a)))
    k.forward(q, kv, sl, scale)
    fused.raw["gluon"] = raw
    head, params = list(seen["args"][:13]), seen["args"][13:]
    plain = list(head)
    plain[5] = False
    x = torch.zeros(1024, device="cuda")
    tiny = k._raw_launch(_tiny[(1,)](x, 1024, BLOCK=1024), (1, 1, 1))
    stream = torch._C._cuda_getCurrentRawStream(x.device.index)
    tiny_args = (1, 1, 1, stream, tiny.function, False, False, None, None, tiny.packed, None, None, None,
                 x.data_ptr(), 1024, 1024)
    res["launch_us"] = interleaved({
        "fused, cooperative": lambda: raw.launch(*head, *params),
        "fused, not cooperative": lambda: raw.launch(*plain, *params),
        "3-argument kernel": lambda: tiny.launch(*tiny_args),
    }, 2000, False)
    calls = {"fused": lambda: k.forward(q, kv, sl, scale), "two kernels": lambda: k.forward(q, kv, sl, scale, config=two)}
    res["eager_wall_us"] = interleaved(calls, 40, True, rounds=25)
    res["eager_host_us"] = interleaved(calls, 2000, False)
    res["kernel_params"] = len(params)
    text = json.dumps(res, indent=1)
    pathlib.Path(os.environ.get("OUT", "."), "mla_launch_cost.json").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
