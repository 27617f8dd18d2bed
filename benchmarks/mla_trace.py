"""Where a fused MLA call spends its time: globaltimer stamps inside every consumer warpgroup of the Gluon stage 1.

Each warpgroup records four times: after it knows its bounds (start), once its partial is stored (arrive), once
the group's barrier lets it through (released), and once its share of the merge is stored (merged). The stamps
are patched into a copy of the kernel's source (the shipped kernel carries no timing code); each patch asserts
that its anchor text is still there, so a changed kernel fails here loudly instead of timing something else.
The stamps go to the spare end of the barrier-word buffer. Prints and writes $OUT/trace.json: per shape, the
min / median / 90th percentile / max over warpgroups, in us after the first program started.

Run (H200): PYTHONPATH=. python benchmarks/mla_trace.py
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "kernels" / "mla_decode" / "mla_splitkv.py"
TRACE_AT = 2048
"""Word offset of the stamps inside one slot of barrier words (the words proper use one per group)."""

STAMP = '''
@gluon.jit
def _stamp():
    return gl.inline_asm_elementwise("mov.u32 $0, %globaltimer_lo;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


'''
BARRIER_CALL = '''    _group_barrier(_group_word(merge[0]), base, (s == 0) & (HALF == 0), 2 * merge[5])
    _merge_half(SEQLENS, OUT, LSE_OUT, merge, b, s, hg, H, split_len, o_sb, o_sh, o_ss, l_sb, l_sh, l_ss,
                HALF, BLOCK_H, S_PAD, UPI, WU)'''
STAMPED_CALL = f'''    t1 = _stamp()
    _group_barrier(_group_word(merge[0]), base, (s == 0) & (HALF == 0), 2 * merge[5])
    t2 = _stamp()
    _merge_half(SEQLENS, OUT, LSE_OUT, merge, b, s, hg, H, split_len, o_sb, o_sh, o_ss, l_sb, l_sh, l_ss,
                HALF, BLOCK_H, S_PAD, UPI, WU)
    gl.thread_barrier()
    t3 = _stamp()
    lin = (b * gl.num_programs(1) + s) * gl.num_programs(0) + hg
    T = merge[0] + {TRACE_AT} + (lin * 2 + HALF) * 4
    gl.store(T, t0)
    gl.store(T + 1, t1)
    gl.store(T + 2, t2)
    gl.store(T + 3, t3)'''
SHAPES = [("M1", {"B": 1, "H": 64, "N": 8192}, {"MERGE": "fused"}),
          ("M1/32-row tiles", {"B": 1, "H": 64, "N": 8192}, {"MERGE": "fused", "BLOCK_N": 32, "num_stages": 4}),
          ("M3", {"B": 32, "H": 64, "N": 8192}, {"MERGE": "fused"})]


def _patch(src: str, old: str, new: str, count: int = 1) -> str:
    if src.count(old) != count:
        raise SystemExit(f"mla_trace: the kernel changed; expected {count} x {old.strip().splitlines()[0]!r}")
    return src.replace(old, new)


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def traced_kernel(folder: Path):
    """The kernel module with the stamps patched in, written to `folder` and imported from there."""
    src = KERNEL.read_text()
    src = _patch(src, "@gluon.jit\ndef _group_barrier", STAMP + "@gluon.jit\ndef _group_barrier")
    bounds = "    b, s, hg, start, end, n_tiles = _bounds(SEQLENS, split_len, BLOCK_N)\n"
    src = _patch(src, bounds, bounds + "    t0 = _stamp()\n", count=2)
    src = _patch(src, "        _finish_group(base, SEQLENS,", "        _finish_group(t0, base, SEQLENS,", count=2)
    src = _patch(src, "def _finish_group(base, SEQLENS,", "def _finish_group(t0, base, SEQLENS,")
    src = _patch(src, BARRIER_CALL, STAMPED_CALL)
    path = folder / "mla_traced.py"
    path.write_text(src)
    module = _load(path, "mla_traced")
    module._SYNC_GROUPS = 2 * TRACE_AT  # room for the stamps after the words
    return module


def quantiles(x: torch.Tensor) -> list[float]:
    qs = torch.quantile(x.flatten().float(), torch.tensor([0.0, 0.5, 0.9, 1.0], device=x.device))
    return [round(float(v), 2) for v in qs]


def trace(module, ref, params: dict, cfg: dict, calls: int = 6) -> dict:
    """Stamps of the last of `calls` eager calls (the first ones compile and warm up)."""
    inputs = ref.make_inputs(params, 0, "cuda")
    for _ in range(calls):
        module._SYNC_WORDS.clear()  # fresh zeroed words: no stale stamps from the previous call
        module.forward(**inputs, config=cfg)
    torch.cuda.synchronize()
    slot = (next(module._SYNC_TURN) - 1) % module._SYNC_SLOTS
    words = module._SYNC_WORDS[inputs["q"].device][slot, TRACE_AT:].view(-1, 2, 4).to(torch.int64) & 0xFFFFFFFF
    used = (words != 0).any(dim=2).any(dim=1)
    words = words[: int(used.nonzero().max()) + 1]
    rel = ((words - words[:, :, 0].min()) % (1 << 32)).float() / 1000.0  # ns -> us, across the 32-bit wrap
    start, arrive, released, merged = (rel[:, :, i] for i in range(4))
    return {"programs": rel.shape[0], "start": quantiles(start), "arrive": quantiles(arrive),
            "released": quantiles(released), "merged": quantiles(merged), "wait": quantiles(released - arrive),
            "merge": quantiles(merged - released)}


def main() -> int:
    if not torch.cuda.is_available():
        print("mla_trace: needs a Hopper GPU", file=sys.stderr)
        return 2
    out_dir = Path(os.environ.get("OUT", "."))
    module = traced_kernel(out_dir)
    ref = _load(ROOT / "kernels" / "mla_decode" / "reference.py", "mla_reference")
    result = {}
    for name, params, cfg in SHAPES:
        result[name] = trace(module, ref, params, cfg)
        print(name, json.dumps(result[name]), flush=True)
    (out_dir / "mla_traced.py").unlink()
    (out_dir / "trace.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
