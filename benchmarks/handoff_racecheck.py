"""Why compute-sanitizer's racecheck reports hazards in the MLA stage 1: a minimal kernel with the same hand-off.

The MLA stage 1 hands the rescale factors from warpgroup 0 to warpgroup 1 through a 64-float shared buffer,
ordered by two mbarriers (`p_ready`, `p_free`), and racecheck reports read-write hazards on that buffer. This kernel
has only that pattern: a producer partition writes the buffer and arrives on `ready`; a consumer partition waits,
reads it and arrives on `free`; the producer waits on `free` before the next write. Every run checks the sums, so
a real race would show as a wrong result. Features of the MLA kernel can be switched on one at a time.

Measured on the H200 (2026-11-30): racecheck reports 0 hazards for the plain hand-off, with a proxy fence, with
the consumer reading a tile through wgmma, with a third one-warp partition and setmaxnreg, and with all of those
together. It reports ~30,000 hazards as soon as the buffer is written from an MMA row layout ("slice"), where the
four lanes of a quad hold the same row value and all four store it, and 0 again when the same values are first
moved to a layout with one owner per value ("slice+dedup"); the sums are right in every mode. So the MLA kernel's
hazards are racecheck reacting to those duplicate same-value stores, not a missing synchronisation.

Run (H200): PYTHONPATH=. compute-sanitizer --tool racecheck python benchmarks/handoff_racecheck.py [MODE] [programs]
"""

import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

ROUNDS = 64


@gluon.jit
def _produce(x_smem, p_smem, ready, free, OUT, ROUNDS: gl.constexpr, FENCE: gl.constexpr, MMA: gl.constexpr,
             SLICE: gl.constexpr, DEDUP: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    p_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    vals = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0])))
    vals = gl.convert_layout(vals, layout).to(gl.float32)
    ones = gl.full([64, 64], 1.0, gl.bfloat16, p_layout)
    for j in range(ROUNDS):
        mbarrier.wait(free, (j & 1) ^ 1)
        if SLICE:
            # As the MLA kernel's rescale factors: a row vector of an MMA-layout tile, 4 lanes holding each row.
            rows = gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout)).to(gl.float32)
            tile = gl.zeros([64, 64], gl.float32, s_layout) + rows[:, None] + j
            if DEDUP:
                # One owner per value: the row vector moved to a blocked layout first.
                x_smem.store(gl.convert_layout(gl.max(tile, axis=1), layout))
            else:
                x_smem.store(gl.max(tile, axis=1))
        else:
            x_smem.store(vals + j)
        if MMA:
            p_smem.store(ones)
        if FENCE:
            fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(ready, count=1)


@gluon.jit
def _consume(x_smem, p_smem, ready, free, OUT, ROUNDS: gl.constexpr, FENCE: gl.constexpr, MMA: gl.constexpr,
             SLICE: gl.constexpr, DEDUP: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, 256, 16])
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    acc_o = gl.zeros([64], gl.float32, row_o)
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, 64, 16])
    acc = gl.zeros([64], gl.float32, layout)
    prod = gl.zeros([64, 64], gl.float32, mma_layout)
    for j in range(ROUNDS):
        mbarrier.wait(ready, j & 1)
        if SLICE:
            acc_o += x_smem.load(row_o)
        else:
            acc += x_smem.load(layout)
        if MMA:
            # p_smem @ p_smem^T: the consumer reads the producer's tile through the tensor cores, as the MLA
            # kernel's value warpgroup reads p; rows of ones, so every entry grows by 64 a round.
            prod = warpgroup_mma(p_smem, p_smem.permute((1, 0)), prod, is_async=True)
            prod = warpgroup_mma_wait(0, deps=[prod])
        gl.thread_barrier()
        mbarrier.arrive(free, count=1)
    if MMA:
        acc += gl.convert_layout(gl.max(prod, axis=1), layout) * 0.0
    if SLICE:
        acc += gl.convert_layout(acc_o, layout)
    gl.store(OUT + gl.arange(0, 64, layout=layout), acc)


@gluon.jit
def _idle(x_smem, p_smem, ready, free, OUT, ROUNDS: gl.constexpr, FENCE: gl.constexpr, MMA: gl.constexpr,
          SLICE: gl.constexpr, DEDUP: gl.constexpr):
    """A one-warp partition that touches nothing, as the MLA kernel's loader warp is one more partition."""
    pass


@gluon.jit
def handoff(OUT, ROUNDS: gl.constexpr, FENCE: gl.constexpr, MMA: gl.constexpr, SLICE: gl.constexpr,
            THIRD: gl.constexpr, DEDUP: gl.constexpr):
    x_smem = gl.allocate_shared_memory(gl.float32, [64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64],
                                       gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16))
    ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(ready, count=1)
    mbarrier.init(free, count=1)
    if THIRD:
        gl.warp_specialize([(_produce, (x_smem, p_smem, ready, free, OUT, ROUNDS, FENCE, MMA, SLICE, DEDUP)),
                            (_consume, (x_smem, p_smem, ready, free, OUT, ROUNDS, FENCE, MMA, SLICE, DEDUP)),
                            (_idle, (x_smem, p_smem, ready, free, OUT, ROUNDS, FENCE, MMA, SLICE, DEDUP))],
                           [4, 1], [240, 24])
    else:
        gl.warp_specialize([(_produce, (x_smem, p_smem, ready, free, OUT, ROUNDS, FENCE, MMA, SLICE, DEDUP)),
                            (_consume, (x_smem, p_smem, ready, free, OUT, ROUNDS, FENCE, MMA, SLICE, DEDUP))],
                           [4], [168])


def main() -> int:
    """One mode per process, so racecheck's summary belongs to that mode. argv[1]: "plain" or features joined by
    "+": fence (a proxy fence before the arrival), mma (the consumer reads a tile through wgmma), slice (the
    buffer written and read in MMA row layouts), dedup (with slice: written from a one-owner layout), third (a
    one-warp third partition, setmaxnreg 240/24); argv[2]: programs (default 1)."""
    mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
    programs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    flags = set(mode.split("+"))
    out = torch.zeros(64, device="cuda")
    extra = {"maxnreg": 168} if "third" in flags else {}
    handoff[(programs,)](out, ROUNDS=ROUNDS, FENCE="fence" in flags, MMA="mma" in flags, SLICE="slice" in flags,
                         THIRD="third" in flags, DEDUP="dedup" in flags, num_warps=4, **extra)
    torch.cuda.synchronize()
    want = torch.arange(64, device="cuda", dtype=torch.float32) * ROUNDS + ROUNDS * (ROUNDS - 1) / 2
    ok = torch.equal(out, want)
    print(f"handoff {mode}: {'right' if ok else 'WRONG'} sums after {ROUNDS} rounds")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
