"""Where a fused MLA call spends its time: globaltimer stamps inside every consumer warpgroup of the Gluon stage 1.

Each warpgroup records eight times (MARKS): when it knows its bounds, when q and the first tile have landed, when
its first product of the last tile is done (warpgroup 0: the scores; warpgroup 1: p handed over), when the
hand-off is done, when its last value product is done, once its partial is stored, once the group's barrier lets
it through, and once its share of the merge is stored. The stamps are patched into a copy of the kernel's source
(the shipped kernel carries no timing code); each patch asserts that its anchor text is still there, so a changed
kernel fails here loudly instead of timing something else. They go to the spare end of the barrier-word buffer.

The inputs rotate over enough sets that the cache of each call comes from DRAM, as in mla_bench's graphs; the
stamps are those of the last call. Prints and writes $OUT/trace.json: per shape and mark, the min / median / 90th
percentile / max over warpgroups, in us after the first program started.

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
MARKS = ("start", "landed", "first_product", "handed_off", "values_done", "stored", "released", "merged")
L2_BYTES = 60 << 20
"""More input bytes than this rotate through the calls, so a call's cache is not left in L2 by the one before."""

MARK = f'''
@gluon.jit
def _stamp():
    return gl.inline_asm_elementwise("mov.u32 $0, %globaltimer_lo;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _mark(SYNC, HALF: gl.constexpr, k: gl.constexpr):
    """Stamp mark k of this warpgroup (every thread stores; the values differ by a few ns)."""
    t = _stamp()
    lin = (gl.program_id(2) * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(0) + gl.program_id(0)
    gl.store(SYNC + {TRACE_AT} + (lin * 2 + HALF) * {len(MARKS)} + k, t)


'''
# (anchor line, occurrences, mark, indent): the mark goes on the line after the anchor.
PATCHES = [
    ("    b, s, hg, start, end, n_tiles, seqlen, base = _consumer_start(scalars, merge, BLOCK_N, FUSED)\n", 2, 0, 4),
    ("    mbarrier.wait(ready.index(0), 0)\n", 2, 1, 4),
    ("        sc = warpgroup_mma_wait(0, deps=[sc]) * qk_scale\n", 1, 2, 8),
    ("        mbarrier.wait(p_ready, j & 1)\n", 1, 2, 8),
    ("        _hand_off(pb, alpha, p_smem, x_smem, p_ready, p_free, j)\n", 1, 3, 8),
    ("        acc = warpgroup_mma_wait(0, deps=[acc])\n", 2, 4, 8),
    # the last lines of the two _store_half calls, inside `if n_tiles > 0:`
    ("                    hg, 0, BLOCK_H, TMA_STORE)\n", 1, 5, 8),
    ("                    1, BLOCK_H, TMA_STORE)\n", 1, 5, 8),
]
BARRIER_CALL = '''    _group_barrier(_group_word(merge[0]), base, (s == 0) & (HALF == 0), 2 * merge[5])
    _merge_half(seqlen, scalars, merge, b, s, hg, HALF, BLOCK_H, S_PAD, UPI, WU)'''
STAMPED_CALL = '''    _group_barrier(_group_word(merge[0]), base, (s == 0) & (HALF == 0), 2 * merge[5])
    _mark(merge[0], HALF, 6)
    _merge_half(seqlen, scalars, merge, b, s, hg, HALF, BLOCK_H, S_PAD, UPI, WU)
    gl.thread_barrier()
    _mark(merge[0], HALF, 7)'''
SHAPES = [("M1", {"B": 1, "H": 64, "N": 8192}, {"MERGE": "fused"}),
          ("M1/thread stores", {"B": 1, "H": 64, "N": 8192}, {"MERGE": "fused", "STORE": "lsu"}),
          ("M1/64 splits", {"B": 1, "H": 64, "N": 8192}, {"MERGE": "fused", "num_splits": 64}),
          ("M2", {"B": 1, "H": 128, "N": 8192}, {"MERGE": "fused"}),
          ("M2/thread stores", {"B": 1, "H": 128, "N": 8192}, {"MERGE": "fused", "STORE": "lsu"})]


def _patch(src: str, old: str, new: str, count: int = 1) -> str:
    if src.count(old) != count:
        raise SystemExit(f"mla_trace: the kernel changed; expected {count} x {old.strip().splitlines()[0]!r}")
    return src.replace(old, new)


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def traced_source() -> str:
    """The kernel's source with the marks patched in; each consumer partition gets its warpgroup number as a
    constexpr local (WG) for the marks to use."""
    src = KERNEL.read_text()
    src = _patch(src, "@gluon.jit\ndef _group_barrier", MARK + "@gluon.jit\ndef _group_barrier")
    for anchor, count, k, indent in PATCHES:
        src = _patch(src, anchor, anchor + " " * indent + f"_mark(merge[0], WG, {k})\n", count)
    src = _patch(src, BARRIER_CALL, STAMPED_CALL)
    for wg, doc in enumerate(('    """Warpgroup 0: scores', '    """Warpgroup 1: the value')):
        start = src.index(doc)
        end = src.index('"""', start + len(doc)) + 4
        src = src[:end] + f"    WG: gl.constexpr = {wg}\n" + src[end:]
    return src


def traced_kernel(folder: Path):
    """The kernel module with the marks patched in, written to `folder` and imported from there."""
    path = folder / "mla_traced.py"
    path.write_text(traced_source())
    module = _load(path, "mla_traced")
    module._SYNC_GROUPS = 2 * TRACE_AT + 2 * len(MARKS) * 132  # room for the stamps after the words
    return module


def quantiles(x: torch.Tensor) -> list[float]:
    x = x.flatten().float()
    x = x[~x.isnan()]
    if x.numel() == 0:
        return []
    qs = torch.quantile(x, torch.tensor([0.0, 0.5, 0.9, 1.0], device=x.device))
    return [round(float(v), 2) for v in qs]


def trace(module, ref, params: dict, cfg: dict, calls: int = 4) -> dict:
    """Stamps of the last call over rotating input sets (the first round compiles and warms up)."""
    first = ref.make_inputs(params, 0, "cuda")
    per_set = sum(t.numel() * t.element_size() for t in first.values() if isinstance(t, torch.Tensor))
    sets = [first] + [ref.make_inputs(params, i, "cuda") for i in range(1, max(2, L2_BYTES // per_set + 2))]
    for i in range(calls * len(sets)):
        module._SYNC_WORDS.clear()  # fresh zeroed words: no stale stamps from the previous call
        module.forward(**sets[i % len(sets)], config=cfg)
    torch.cuda.synchronize()
    slot = (next(module._SYNC_TURN) - 1) % module._SYNC_SLOTS
    words = module._SYNC_WORDS[first["q"].device][slot, TRACE_AT:].view(-1, 2, len(MARKS)).to(torch.int64)
    words = words & 0xFFFFFFFF
    used = (words != 0).any(dim=2).any(dim=1)
    words = words[: int(used.nonzero().max()) + 1]
    rel = ((words - words[:, :, 0].min()) % (1 << 32)).float() / 1000.0  # ns -> us, across the 32-bit wrap
    rel[words == 0] = float("nan")  # a mark this warpgroup has not (warpgroup 1 hands nothing off)
    result = {"programs": rel.shape[0], "sets": len(sets)}
    for wg in (0, 1):
        for i, name in enumerate(MARKS):
            result[f"wg{wg}/{name}"] = quantiles(rel[:, wg, i])
    return result


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
        print(name, flush=True)
        for key, value in result[name].items():
            print(f"  {key:22s} {value}", flush=True)
    (out_dir / "mla_traced.py").unlink()
    (out_dir / "trace.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
