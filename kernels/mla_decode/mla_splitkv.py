"""Our split-KV MLA decode: stage 1 reads each latent tile once for QK and PV over all heads, stage 2 merges splits.

Stage 1 has two implementations. On a Hopper GPU it is a warp-specialised Gluon kernel (TMA loader warp, a
warpgroup that scores and runs the softmax, a warpgroup for the second half of the value columns); everywhere else
(the CPU interpreter, other GPUs, fp32 inputs, strided q) it is the tl kernel, which the CPU tests check. With many
splits (B=1) the Gluon kernel also does stage 2's work: its programs meet at a barrier per (batch row, head group)
and each merges a share of the partials, so the call is a single (cooperative) launch.
"""

import dataclasses
import functools
import itertools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor

TUNABLES = {"BLOCK_N": [16, 32, 64], "num_stages": [2, 3, 4, 6, 8], "num_splits": [0, 16, 32, 64, 128],
            "LAZY_RESCALE": [False, True], "BLOCK_H": [16, 32, 64], "num_warps": [4, 8],
            "LOAD": ["masked", "peeled", "tma"], "MERGE_BLOCK_D": [0, 32, 64, 128, 256, 512],
            "MERGE_HEADS": [1, 2, 4, 8, 16], "PDL": [False, True], "STAGE1": ["triton", "gluon"],
            "MERGE": ["kernel", "fused", "auto"], "STORE": ["lsu", "tma"], "LAUNCH": ["cached", "jit"],
            "DESC": ["host", "device", "auto"]}
# num_splits 0 means: choose from the shape so that stage 1 has about one program per SM.
# Measured on the H200 (benchmarks/mla_bench.py --tune, 2026-11-29): BLOCK_N=64 x 2 stages is fastest at M3
# (163 us) and ties at M1 (17.3 us); 32 x 3/4 stages 170/171 us, 16 x 6/8 stages 278 us, and LAZY_RESCALE is 4-7%
# slower (it spills a little at 255 registers). Deeper pipelining buys nothing, so the per-tile math (72 small
# 64x16x16 or 64x32x16 wgmmas for QK, each re-reading q from shared memory) is the limit, not load latency.
# BLOCK_H (heads per stage-1 program) and num_warps (its warps) trade partial traffic and L2 re-reads against
# tensor-core shape: at 64 heads the QK is a wgmma, below it mma.sync; a 64x512 fp32 accumulator needs 8 warps.
# LOAD: "masked" loads every tile with a row mask; "peeled" loads full tiles unmasked and masks only the last;
# "tma" reads the full tiles through host-built tensor descriptors (TMA on Hopper; the interpreter emulates them).
# LOAD="tma" ships because it won every shape (benchmarks/mla_variants.py, H200, 2026-11-30, graph us per call
# M1/M2/M3/M4): masked 17.58/22.57/162.8/514.3, peeled 17.04/21.81/151.2/482.2, tma 16.99/21.77/149.6/480.9
# (M3 2.05 TB/s); it is also the only one without spills (255 registers, 0 spilled; masked spills 22), and it
# passed every check, NaN tails and NaN scratch included. BLOCK_H 16/32 lost badly at M3/M4 and tied at M1.
# MERGE_BLOCK_D: stage-2 columns per program, 0 = chosen from the split count. MERGE_HEADS: at most this many
# (batch, head) rows per stage-2 program (the wrapper lowers it when many splits make the tile large).
# PDL: launch stage 2 as a programmatic dependent of stage 1 (griddepcontrol); ignored on the CPU interpreter.
# Second H200 sweep, same day (graph us M1/M2/M3/M4; merge us at M3 from the profiler): tma 16.78/22.56/171.3/496.2
# (merge 30.8), tma + MERGE_HEADS 8 16.91/21.33/141.1/509.9 (merge 3.6; M4 has one split and no merge, so its
# 3% is noise), tma + PDL 17.90/25.08/170.0/491.4 (M3 merge 124 us: the dependent grid occupies SMs while it
# waits). So MERGE_HEADS 8 ships (M3 2.17 TB/s) and PDL stays off.
# STAGE1: "gluon" runs stage 1 as the warp-specialised Gluon kernel where gluon_ok allows, else the tl kernel. The
# tl kernel computes each 64x64 score block in both of its warpgroups (one 255-register program, no control over
# that), and its per-tile chain took about 4.3 us at M3. The Gluon kernel scores once, in one warpgroup, and
# overlaps the other warpgroup's PV with it. H200, same run, graph us M1/M2/M3/M4 (benchmarks/mla_variants.py,
# 2026-11-30): tl 16.10/21.45/149.1/497.1, gluon 13.98/17.13/84.81/251.7 (M3 3.61 TB/s). Measured and dropped on
# the way: both warpgroups scoring (95.2 us at M3), the accumulator stored straight from registers (4-byte stores,
# M1 19.5 us), the previous PV queued behind the next scores (20 spills, M3 105 us), and tiles loaded in column
# chunks on separate barriers (its checks timed out; not debugged).
# MERGE: "kernel" runs stage 2 as a kernel of its own; "fused" has the Gluon stage 1 merge its splits itself after a
# barrier per (batch row, head group) under a cooperative launch (one launch, no drain between the stages); "auto"
# fuses from FUSED_MIN_SPLITS splits. In-kernel stamps at M1 (globaltimer, H200): partials all stored by 7.2 us,
# barrier released at 8.2-8.5 us, merged by 10.6-12.2 us, so the partials' round trip through L2 (8.4 MB written,
# then read back) is now most of what is left above the 2 us that reading the cache takes.
# STORE: how stage 1 writes o (its partials, or the output itself with one split). "lsu": every thread stores 16-byte
# pieces of the staged block; "tma": the TMA unit copies the staged block out, and the warpgroup waits until the
# writes are done (not just read), which the fused merge's release needs. A plain probe (benchmarks/sm_traffic_probe.py,
# H200) puts a multiprocessor's store rate near 45 GB/s whichever way: 64 KB take 1.5 us to issue and 1.4 us more
# to drain, then 2 us to read back. TMA saves ~1% at B=1 and ties at M3/M4: graph us M1/M2/M3/M4 (mla_variants.py,
# 2026-11-30, two runs) lsu 14.51/15.45/84.69/265.4 and 14.46/15.37/85.84/270.5, tma 14.35/15.31/83.73/266.1 and
# 14.25/15.29/86.18/268.4. H % 64 != 0 keeps "lsu" (a box would cross into the next batch row's heads).
# Also measured with the Gluon stage 1 (graph us M1/M2/M3/M4, H200, 2026-11-30; the shipped 64 x 2 two-kernel run
# alongside was 14.74/17.03/83.31/257.6): PDL, stage 1 releasing stage 2 right after issuing its loads,
# 16.82/20.05/82.26/269.5; 32-row tiles x 4 stages, 14.41/17.80/102.7/380.8. Neither ships.
# LAUNCH: "cached" keeps a plan per input layout (shapes, strides, dtypes, devices, alignment, config) and launches its
# compiled kernels' handles with plain addresses and cached TMA descriptors from the plan's second call on; "jit"
# launches through the JIT functions every call. H200, same run (benchmarks/mla_compare.py, 2026-12-01), M1 eager us
# per call / host us per call without a sync: cached 31.5 / 28.0, jit 92.9 / 90.5, main's kernel before this change
# 140.9 / 146.5; graph times unchanged (14.25 / 14.18 / 14.30). Of the 28 us, Triton's launcher wrapper (a Python
# loop over the 37 arguments, three descriptor encodings) is about a third (the raw launches below now skip the
# runner around it; with host descriptors the wrapper's loop remains).
# DESC: where the Gluon stage 1's three TMA descriptors are built. "host": cached host descriptors, which Triton's
# launcher wrapper expands into CUtensorMaps in a Python loop over every argument on each launch; "device": each
# program builds them in Triton's global scratch (128 B each, _global_scratch; since 2026-12-02 each partition
# builds the ones it reads, four in all, _mla_split_attend_ws), so the launch is plain integers;
# "auto": device for eager calls, host for calls being captured into a graph (plan.graph_twin). H200, M1, same run
# (benchmarks/mla_host.py, 2026-12-01, lease 1): eager host us per call device 22.3 / host 28.1, GPU us per call
# 14.55 / 12.85 (building descriptors in the kernel puts 1.3-3.4 us on every program's critical path, M1-M5), hence
# "auto" ships: graphs keep the host descriptors' GPU time, eager calls the device descriptors' launch. Its costs:
# the evaluator's gated eager timing (GPU time only) reads M1 19.8 against 17.8 us, geomean 2.14x against 2.25x, and a
# cold evaluation compiles stage 1 in both modes (compile phase 57 against 29 s); DESC "host" avoids both. With the
# builds in the partitions (2026-12-02) that eager reading is M1 18.91 us, geomean 2.148x (benchmarks/RESULTS.md).
# Raw launches (_RawLaunch): where no Triton launch hook is set, an eager call of a ready plan calls each compiled
# kernel's C launch itself on the current stream, skipping the runner (device and stream lookups, launch metadata,
# two hook chains) and the allocator hook. H200, M1, interleaved against main's kernel (benchmarks/mla_host.py,
# 2026-12-02, two leases): wall us per eager call 20.97 / 21.59 against 26.47 / 26.79, graphs unchanged (12.7-12.8).
# Paged caches: the Gluon stage 1 reads a 64-row tile per page lookup (page size a multiple of BLOCK_N), at the
# contiguous cache's speed (M5 = M3 paged by 64: 85.4 against 84.6 us graphed); page size 1 takes the tl stage 1,
# which gathers rows through pointers (M6: 162.2 us, FlashInfer's fa3 94.3).
CONFIG = {"BLOCK_N": 64, "num_stages": 2, "num_splits": 0, "LAZY_RESCALE": False, "BLOCK_H": 64, "num_warps": 8,
          "LOAD": "tma", "MERGE_BLOCK_D": 0, "MERGE_HEADS": 8, "PDL": False, "STAGE1": "gluon", "MERGE": "auto",
          "STORE": "tma", "LAUNCH": "cached", "DESC": "auto"}

D_LATENT = 512
D_ROPE = 64
LOG2E = 1.4426950408889634


@triton.jit
def _attend_tile(q_lat, q_rope, c, r, mask_n, m_i, l_i, acc, qk_scale,
                 MASKED: tl.constexpr, LAZY_RESCALE: tl.constexpr):
    """One online-softmax step over a latent tile c [BLOCK_N, 512] and its rope part r [BLOCK_N, 64].

    The latent tile is used twice: transposed it is the key's latent part, as is it is the value. MASKED sends
    scores of rows past the split's end to -inf; a full tile skips that select.
    """
    s = tl.dot(q_lat, tl.trans(c))
    s = tl.dot(q_rope, tl.trans(r), s)
    # Log2 units from here on, in both stages: exp2 is the hardware exponential.
    s = s * qk_scale
    if MASKED:
        s = tl.where(mask_n[None, :], s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    if LAZY_RESCALE:
        # Rescaling the 64x512 accumulator costs 128 multiplies a thread per tile; skip it until some row's
        # max has grown by more than 8 (p <= 256 meanwhile, harmless in fp32 and bf16). m_i, l_i and acc
        # stay consistent with whatever max was last applied, which is all the final lse needs.
        if tl.max(m_new - m_i, axis=0) > 8.0:
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
            m_i = m_new
        p = tl.exp2(s - m_i[:, None])
        l_i = l_i + tl.sum(p, axis=1)
    else:
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        m_i = m_new
    acc = tl.dot(p.to(c.dtype), c, acc)
    return m_i, l_i, acc


@triton.jit
def _row_ptrs(KV, BT, b, offs_n, live, stride_kvb, stride_kvn, stride_btb, PS, PAGED: tl.constexpr):
    """Where the cache rows offs_n of batch row b start: b's slab of a contiguous cache, or, paged, row offs_n % PS
    of the page b's block table names (stride_kvb is then the page stride). Rows that are not live read no table
    entry: past a row's pages it may be UNUSED (-1)."""
    if PAGED:
        page = tl.load(BT + b * stride_btb + offs_n // PS, mask=live, other=0).to(tl.int64)
        return KV + page * stride_kvb + (offs_n % PS) * stride_kvn
    return KV + b * stride_kvb + offs_n * stride_kvn


@triton.jit
def _load_masked_tile(KV, BT, b, n0, end, stride_kvb, stride_kvn, stride_btb, PS, PAGED: tl.constexpr,
                      D_LAT: tl.constexpr, D_ROPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows [n0, n0 + BLOCK_N) of the cache through pointers, rows at or past `end` zeroed (they may hold NaN)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < end
    row_ptr = _row_ptrs(KV, BT, b, offs_n, mask_n, stride_kvb, stride_kvn, stride_btb, PS, PAGED)[:, None]
    c = tl.load(row_ptr + tl.arange(0, D_LAT)[None, :], mask=mask_n[:, None], other=0.0)
    r = tl.load(row_ptr + D_LAT + tl.arange(0, D_ROPE)[None, :], mask=mask_n[:, None], other=0.0)
    return c, r, mask_n


@triton.jit
def _mla_split_attend(
    Q, KV, SEQLENS, O, LSE, OP, LSEP, KV_LAT_DESC, KV_ROPE_DESC, BT,
    qk_scale, split_len,
    stride_qb, stride_qh, stride_kvb, stride_kvn, stride_ob, stride_oh, stride_btb,
    H, N, PS, num_splits,
    D_LAT: tl.constexpr, D_ROPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    SINGLE: tl.constexpr, LAZY_RESCALE: tl.constexpr, LOAD: tl.constexpr, PDL: tl.constexpr,
    PAGED: tl.constexpr,
):
    """One (head group, split, batch row): online softmax over rows [s*split_len, min((s+1)*split_len, len)).

    With SINGLE the split is the whole row and the program writes the final o and lse; otherwise it writes o
    normalised by its own denominator (in OP's dtype) and lse in log2 units to the partial buffers, and writes
    nothing at all when the split is empty (stage 2 skips it by the same bounds).
    LOAD 0 masks every tile; 1 and 2 peel the last partial tile off, so the full tiles load unmasked (2: through
    the TMA descriptors over the cache viewed as [rows, 576]) and only the tail pays for the mask. Rows past the
    length may hold anything, NaN included, so the tail always goes through a masked load that zeroes them.
    PAGED reads row n of batch row b from page BT[b, n // PS], row n % PS of it (with LOAD 2 the host has checked
    that PS is a multiple of BLOCK_N, so a full tile lies in one page).
    With PDL every program lets the dependent merge launch at once: the merge can only start on SMs this grid
    leaves free (one program fills an SM's registers), and it waits for this whole grid before reading partials.
    """
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid_hg = tl.program_id(0)
    pid_s = tl.program_id(1)
    # 64-bit row offsets: B*N*576 passes 2**31 elements at long contexts.
    b = tl.program_id(2).to(tl.int64)
    seqlen = tl.load(SEQLENS + b)
    start = pid_s * split_len
    end = tl.minimum(start + split_len, seqlen)

    offs_h = pid_hg * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    offs_c = tl.arange(0, D_LAT)
    offs_r = tl.arange(0, D_ROPE)
    q_ptr = Q + b * stride_qb + offs_h[:, None] * stride_qh
    # q stays a plain load so the compiler can park it in shared memory as the MMA operand; the scale is
    # applied to the fp32 scores instead (one multiply per score, and no second bf16 rounding of q).
    q_lat = tl.load(q_ptr + offs_c[None, :], mask=mask_h[:, None], other=0.0)
    q_rope = tl.load(q_ptr + D_LAT + offs_r[None, :], mask=mask_h[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D_LAT], dtype=tl.float32)
    if LOAD == 0:
        for n0 in range(start, end, BLOCK_N):
            c, r, mask_n = _load_masked_tile(KV, BT, b, n0, end, stride_kvb, stride_kvn, stride_btb, PS, PAGED,
                                             D_LAT, D_ROPE, BLOCK_N)
            m_i, l_i, acc = _attend_tile(q_lat, q_rope, c, r, mask_n, m_i, l_i, acc, qk_scale, True, LAZY_RESCALE)
        tail = end
    else:
        tail = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
        for n0 in range(start, tail, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            if LOAD == 2:
                # Global row of the [rows, 576] view; every row of a full tile is below the length.
                if PAGED:
                    row = tl.load(BT + b * stride_btb + n0 // PS) * PS + n0 % PS
                else:
                    row = (b * N).to(tl.int32) + n0
                c = KV_LAT_DESC.load([row, 0])
                r = KV_ROPE_DESC.load([row, D_LAT])
            else:
                row_ptr = _row_ptrs(KV, BT, b, offs_n, offs_n >= 0, stride_kvb, stride_kvn, stride_btb, PS,
                                    PAGED)[:, None]
                c = tl.load(row_ptr + offs_c[None, :])
                r = tl.load(row_ptr + D_LAT + offs_r[None, :])
            m_i, l_i, acc = _attend_tile(q_lat, q_rope, c, r, offs_n, m_i, l_i, acc, qk_scale, False,
                                         LAZY_RESCALE)
        if tail < end:
            c, r, mask_n = _load_masked_tile(KV, BT, b, tail, end, stride_kvb, stride_kvn, stride_btb, PS, PAGED,
                                             D_LAT, D_ROPE, BLOCK_N)
            m_i, l_i, acc = _attend_tile(q_lat, q_rope, c, r, mask_n, m_i, l_i, acc, qk_scale, True, LAZY_RESCALE)

    # An empty split has l_i == 0; its results are never stored, the guard only keeps 0/0 out of the arithmetic.
    nonempty = start < seqlen
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse2 = m_i + tl.log2(l_safe)
    if SINGLE:
        o_ptr = O + b * stride_ob + offs_h[:, None] * stride_oh + offs_c[None, :]
        tl.store(o_ptr, out.to(O.dtype.element_ty), mask=mask_h[:, None])
        tl.store(LSE + b * H + offs_h, lse2 * 0.6931471805599453, mask=mask_h)
    else:
        row = (b * H + offs_h) * num_splits + pid_s
        tl.store(OP + row[:, None] * D_LAT + offs_c[None, :], out.to(OP.dtype.element_ty),
                 mask=mask_h[:, None] & nonempty)
        tl.store(LSEP + row, lse2, mask=mask_h & nonempty)


@triton.jit
def _mla_merge_splits(
    OP, LSEP, SEQLENS, O, LSE,
    split_len,
    stride_ob, stride_oh,
    H, BH, num_splits,
    D_LAT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    """BLOCK_M (batch, head) rows x BLOCK_D columns: weights exp2(lse_s - max) over the non-empty splits only.

    Everything that does not read stage 1's output (lengths, masks, addresses) comes before the grid-dependency
    wait, so under PDL it overlaps stage 1 instead of adding a dependent load to the critical path.
    """
    pid_m = tl.program_id(0)
    pid_d = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < BH
    b = offs_m // H
    h = offs_m % H
    seqlen = tl.load(SEQLENS + b, mask=mask_m, other=0)
    offs_s = tl.arange(0, BLOCK_S)
    # Same bounds as stage 1: split s holds rows from s*split_len, so it is empty when that is past the length.
    valid = mask_m[:, None] & (offs_s[None, :] < num_splits) & (offs_s[None, :] * split_len < seqlen[:, None])
    rows = offs_m[:, None] * num_splits + offs_s[None, :]
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    part_ptr = OP + rows[:, :, None] * D_LAT + offs_d[None, None, :]
    if PDL:
        tl.extra.cuda.gdc_wait()
    lse = tl.load(LSEP + rows, mask=valid, other=-float("inf"))
    # Issued before the weights exist, so both loads are in flight together.
    part = tl.load(part_ptr, mask=valid[:, :, None], other=0.0).to(tl.float32)
    m = tl.max(lse, axis=1)
    # Split 0 is never empty (len >= 1), but a -inf max would turn every weight into exp2(-inf + inf) = NaN;
    # rows past B*H (a partial last group) have no valid split at all and are never stored.
    m = tl.where(m == -float("inf"), 0.0, m)
    w = tl.where(valid, tl.exp2(lse - m[:, None]), 0.0)
    denom = tl.sum(w, axis=1)
    denom = tl.where(denom > 0.0, denom, 1.0)
    out = tl.sum(part * w[:, :, None], axis=1) / denom[:, None]
    tl.store(O + b[:, None] * stride_ob + h[:, None] * stride_oh + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=mask_m[:, None])
    if pid_d == 0:
        tl.store(LSE + offs_m, (m + tl.log2(denom)) * 0.6931471805599453, mask=mask_m)


# Gluon kernels read module globals only as constexprs.
G_LAT = gl.constexpr(512)
G_ROPE = gl.constexpr(64)
G_HALF = gl.constexpr(256)
# Each fused call adds exactly this much to its group's barrier word: a power of two above the most arrivals
# (two warpgroups x 128 splits).
G_SYNC_ROUND = gl.constexpr(1024)


@gluon.jit
def _bounds(SEQLENS, split_len, BLOCK_N: gl.constexpr):
    """(batch row, split, head group, first row, end row, tile count, row length) of this program; each partition
    asks."""
    hg = gl.program_id(0)
    s = gl.program_id(1)
    b = gl.program_id(2)
    seqlen = gl.load(SEQLENS + b)
    start = s * split_len
    end = gl.minimum(start + split_len, seqlen)
    n_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_N)
    return b, s, hg, start, end, n_tiles, seqlen


@gluon.jit
def _issue_rows(desc, row, bar, lat_buf, rope_buf):
    """Rows [row, row + box) of a [rows, 576] tensor into a 512-column and a 64-column buffer, on one barrier. The
    descriptor's box is 64 columns (the 128-byte swizzle span, as wide as a box may be), so one descriptor serves
    both parts: nine copies, as Gluon itself would split a 512-wide box into."""
    mbarrier.expect(bar, (G_LAT // 64 + 1) * desc.block_type.nbytes)
    for k in gl.static_range(G_LAT // 64):
        tma.async_copy_global_to_shared(desc, [row, k * 64], bar, lat_buf.slice(k * 64, 64, dim=1))
    tma.async_copy_global_to_shared(desc, [row, G_LAT], bar, rope_buf)


@gluon.jit
def _tile_row(pages, N, b, n0, PAGED: gl.constexpr):
    """Where the tile at logical row n0 of batch row b starts in the cache viewed as [rows, 576]: b's own N rows of a
    contiguous cache, or, paged, row n0 % PS of the page b's block table names (the host has checked that PS is a
    multiple of the tile, so a tile lies in one page). The first tile of an empty split may come from an entry past
    the row's pages, which may be UNUSED (-1): page 0 stands in (the tile is waited for, never scored)."""
    BT, bt_stride, PS = pages
    row = b * N + n0
    if PAGED:
        row = gl.maximum(gl.load(BT + b * bt_stride + n0 // PS), 0) * PS + n0 % PS
    return row


@gluon.jit
def _device_descriptor(base, rows, cols, box_rows: gl.constexpr):
    """A TMA descriptor of a [rows, cols] bf16 tensor in boxes of [box_rows, 64], built by the calling partition in
    Triton's global scratch (DEVICE_DESC)."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([box_rows, 64], gl.bfloat16)
    return tma.make_tensor_descriptor(base, [rows, cols], [cols, 1], [box_rows, 64], layout)


@gluon.jit
def _q_descriptor(descs, BLOCK_H: gl.constexpr, DEVICE_DESC: gl.constexpr):
    """q's descriptor: the host's, or (DEVICE_DESC) one built here from q's base. descs is (q, the cache rows, o, and
    the row counts of q, the cache and o's columns)."""
    desc = descs[0]
    if DEVICE_DESC:
        desc = _device_descriptor(descs[0], descs[3], G_LAT + G_ROPE, BLOCK_H)
    return desc


@gluon.jit
def _kv_descriptor(descs, BLOCK_N: gl.constexpr, DEVICE_DESC: gl.constexpr):
    """The cache rows' descriptor, as _q_descriptor."""
    desc = descs[1]
    if DEVICE_DESC:
        desc = _device_descriptor(descs[1], descs[4], G_LAT + G_ROPE, BLOCK_N)
    return desc


@gluon.jit
def _o_descriptor(descs, BLOCK_H: gl.constexpr, DEVICE_DESC: gl.constexpr, TMA_STORE: gl.constexpr):
    """o's descriptor (the partials' with several splits), as _q_descriptor. Without TMA_STORE o is written by plain
    stores, and what is returned (the host's stand-in, or o's base) is passed on unread."""
    desc = descs[2]
    if DEVICE_DESC and TMA_STORE:
        desc = _device_descriptor(descs[2], descs[3], descs[5], BLOCK_H)
    return desc


@gluon.jit
def _g_load(descs, smem, bars, scalars, pages, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr,
            STAGES: gl.constexpr, PAGED: gl.constexpr, DEVICE_DESC: gl.constexpr):
    """The loader warp: q and the split's first tile at once, then the rest through a ring of STAGES buffers.

    The first loads depend only on the program's coordinates (and, paged, one block-table entry), so they go out
    before the length has arrived (a global load's latency off the critical path at B=1, where a split is one
    tile). The first tile may lie past the length (an empty split) or past the cache (zero-filled); the consumers
    wait for it either way, so no copy is still landing in shared memory when the program exits. A later tile's
    page is looked up before waiting for its stage, so that load overlaps the wait.
    """
    q_desc = _q_descriptor(descs, BLOCK_H, DEVICE_DESC)
    kv_desc = _kv_descriptor(descs, BLOCK_N, DEVICE_DESC)
    q_smem, qr_smem, c_smem, r_smem, p_smem, x_smem = smem
    q_bar, ready, empty, p_ready, p_free = bars
    SEQLENS, split_len, H, N, qk_scale, OUT, LSE_OUT, o_sb, o_sh, o_ss, l_sb, l_sh, l_ss = scalars
    b = gl.program_id(2)
    n_start = gl.program_id(1) * split_len
    _issue_rows(q_desc, b * H + gl.program_id(0) * BLOCK_H, q_bar, q_smem, qr_smem)
    _issue_rows(kv_desc, _tile_row(pages, N, b, n_start, PAGED), ready.index(0), c_smem.index(0), r_smem.index(0))
    n_tiles = _bounds(SEQLENS, split_len, BLOCK_N)[5]
    for j in range(1, n_tiles):
        stage = j % STAGES
        row = _tile_row(pages, N, b, n_start + j * BLOCK_N, PAGED)
        mbarrier.wait(empty.index(stage), ((j // STAGES) & 1) ^ 1)
        _issue_rows(kv_desc, row, ready.index(stage), c_smem.index(stage), r_smem.index(stage))


@gluon.jit
def _zero_rows(c_stage, valid, HALF: gl.constexpr, BLOCK_N: gl.constexpr):
    """Zero this warpgroup's value columns in the tile rows at or past `valid`: they may hold NaN, and 0 * NaN
    would reach the accumulator through the PV product even though their probabilities are 0."""
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    keep = (rows < valid)[:, None]
    for k in gl.static_range(G_HALF // 64):
        part = c_stage.slice(HALF * G_HALF + k * 64, 64, dim=1)
        tile = part.load(layout)
        part.store(gl.where(keep, tile, gl.zeros_like(tile)))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _store_half(acc, inv_l, staging, scalars, o_desc, b, s, hg, HALF: gl.constexpr, BLOCK_H: gl.constexpr,
                TMA_STORE: gl.constexpr):
    """o = acc / l for this warpgroup's 256 columns, regrouped through shared memory so that each warp writes
    whole 512-byte rows: straight from the accumulator a thread holds column pairs, and those 4-byte stores
    cost 6 us of the 15 at B=1 (H200). TMA_STORE hands the staged block to the TMA unit instead (o_desc views the
    output as [B*H, splits*512], in boxes of 64 columns); it waits until the writes are done, not just read, so
    that the fused merge's release covers them."""
    H, OUT, o_sb, o_sh, o_ss = scalars[2], scalars[5], scalars[7], scalars[8], scalars[9]
    staging.store((acc * inv_l[:, None]).to(OUT.dtype.element_ty))
    if TMA_STORE:
        fence_async_shared()
        gl.thread_barrier()
        # One copy per 64 columns (128 bytes, the swizzle's span): a box may be no wider, and unlike the loads the
        # store is not split by Gluon itself.
        for k in gl.static_range(G_HALF // 64):
            tma.async_copy_shared_to_global(o_desc, [b * H + hg * BLOCK_H, s * (2 * G_HALF) + HALF * G_HALF + k * 64],
                                            staging.slice(k * 64, 64, dim=1))
        tma.store_wait(0)
        gl.inline_asm_elementwise("mov.u32 $0, 0; cp.async.bulk.wait_group 0; fence.proxy.async.global;", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)
        gl.thread_barrier()
    else:
        gl.thread_barrier()
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
        out = staging.load(layout)
        offs_h = hg * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, layout))
        cols = HALF * G_HALF + gl.arange(0, G_HALF, layout=gl.SliceLayout(0, layout))
        o_ptr = OUT + b.to(gl.int64) * o_sb + offs_h[:, None] * o_sh + s * o_ss + cols[None, :]
        gl.store(o_ptr, out, mask=(offs_h < H)[:, None])


@gluon.jit
def _softmax_step(sc, m_i, l_i, valid, c, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """Online-softmax update for one tile of scores (log2 units); a tile cut by the split's end masks its
    columns past `valid` and zeroes the matching value rows of this warpgroup's half."""
    if valid < BLOCK_N:
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        sc = gl.where((cols < valid)[None, :], sc, -float("inf"))
        _zero_rows(c, valid, 0, BLOCK_N)
    m_new = gl.maximum(m_i, gl.max(sc, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(sc - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p.to(gl.bfloat16), alpha, m_new, l_i


@gluon.jit
def _hand_off(pb, alpha, p_smem, x_smem, p_ready, p_free, j):
    """p and the rescale factors of tile j to warpgroup 1; one set is in flight, so first wait until warpgroup
    1 has used the previous one. The partition barrier before the one elected arrival orders every thread's
    stores before it (the arrival's release covers what its thread has synchronised with).

    compute-sanitizer's racecheck flags the factors' buffer: the four lanes of a quad each store the same row
    value. benchmarks/handoff_racecheck.py shows that this alone draws the report and that the ordering is sound."""
    mbarrier.wait(p_free, (j & 1) ^ 1)
    p_smem.store(pb)
    x_smem.store(alpha)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(p_ready, count=1)


@gluon.jit
def _group_word(SYNC):
    """This program's (batch row, head group) barrier word: the one place that maps programs to words."""
    return SYNC + gl.program_id(2) * gl.num_programs(0) + gl.program_id(0)


@gluon.jit
def _group_base(merge, FUSED: gl.constexpr):
    """Where this call's count for the program's (batch row, head group) starts: the word's value rounded down to
    G_SYNC_ROUND. Read when the partition starts, off the critical path; it is right even if other splits have
    already arrived, because the count reaches the next multiple only once this program has arrived too."""
    base = 0
    if FUSED:
        base = gl.load(_group_word(merge[0]), volatile=True) & ~(G_SYNC_ROUND - 1)
    return base


@gluon.jit
def _group_barrier(SYNC, base, leader, arrivals):
    """Wait until `arrivals` warpgroups (both consumers of every split of this (batch row, head group)) have stored
    their partials.

    The word only grows: each call adds exactly G_SYNC_ROUND to it (the leader adds what the others do not), so it
    is a multiple of that between calls whatever split count the last call had, and needs no reset; int32
    wrap-around is harmless because the round divides 2**32. An arrival is one elected thread's release after a
    partition barrier, so it covers the whole warpgroup's stores (the cooperative-groups grid-sync pattern), and
    it is fire-and-forget: the only round trips on the critical path are the polls. The launch is cooperative, so
    every program is resident and the spin cannot starve one that is not.
    """
    gl.thread_barrier()
    share = gl.where(leader, G_SYNC_ROUND - (arrivals - 1), 1)
    gl.atomic_add(SYNC, share, sem="release", scope="gpu")
    count = gl.atomic_add(SYNC, 0, sem="acquire", scope="gpu")
    while count - base < G_SYNC_ROUND:
        count = gl.atomic_add(SYNC, 0, sem="acquire", scope="gpu")
    gl.thread_barrier()


@gluon.jit
def _merge_half(seqlen, scalars, merge, b, s, hg, HALF: gl.constexpr, BLOCK_H: gl.constexpr, S_PAD: gl.constexpr,
                UPI: gl.constexpr, WU: gl.constexpr):
    """Stage 2 inside stage 1: this warpgroup merges its share of the group's partials for its 256 columns.

    The work is 2 * BLOCK_H units of (head, 128 columns); split s takes a contiguous run of them, UPI at a
    time as one [UPI, S_PAD, 128] load of every split's partial (32 KB at 128 splits, all in flight at once).
    Partials are read past L1 (.cg): they were written by other multiprocessors. The row length comes from the
    partition's start: a load of it here would put a round trip between the barrier and the partials' loads.
    """
    SEQLENS, split_len, H, N, qk_scale, OUT, LSE_OUT, o_sb, o_sh, o_ss, l_sb, l_sh, l_ss = scalars
    SYNC, O, LSE, f_sb, f_sh, S = merge
    # 8 columns (16 bytes) a thread; warps across units when there are 4 or more (WU = 4), else across columns, so
    # the sums over splits stay inside a warp: a cross-warp reduction needs scratch beyond the 227 KB limit.
    layout: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 32 // (4 * WU), 4 * WU], [WU, 1, 4 // WU], [2, 1, 0])
    l_lse: gl.constexpr = gl.SliceLayout(2, layout)
    l_out: gl.constexpr = gl.SliceLayout(1, layout)
    units = 2 * BLOCK_H
    per = gl.cdiv(units, S)
    u_lo = s * per
    u_hi = gl.minimum(u_lo + per, units)
    sp = gl.arange(0, S_PAD, layout=gl.SliceLayout(0, l_lse))
    split_ok = (sp < S) & (sp * split_len < seqlen)
    cols = gl.arange(0, 128, layout=gl.SliceLayout(0, l_out))
    for u0 in range(u_lo, u_hi, UPI):
        u = u0 + gl.arange(0, UPI, layout=gl.SliceLayout(1, l_lse))
        head = hg * BLOCK_H + u // 2
        ok = ((u < u_hi) & (head < H))[:, None] & split_ok[None, :]
        lse = gl.load(LSE_OUT + b * l_sb + head[:, None] * l_sh + sp[None, :] * l_ss, mask=ok,
                      other=-float("inf"), cache_modifier=".cg")
        base = (b.to(gl.int64) * o_sb + head[:, None] * o_sh + sp[None, :] * o_ss + HALF * G_HALF
                + (u % 2)[:, None] * 128)
        part = gl.load(OUT + base[:, :, None] + cols[None, None, :], mask=ok[:, :, None], other=0.0,
                       cache_modifier=".cg")
        m = gl.max(lse, axis=1)
        m = gl.where(m == -float("inf"), 0.0, m)
        w = gl.where(ok, gl.exp2(lse - m[:, None]), 0.0)
        denom = gl.sum(w, axis=1)
        denom = gl.where(denom > 0.0, denom, 1.0)
        w = w / denom[:, None]
        out = gl.sum(part.to(gl.float32) * w[:, :, None], axis=1)
        u_o = u0 + gl.arange(0, UPI, layout=gl.SliceLayout(1, l_out))
        head_o = hg * BLOCK_H + u_o // 2
        o_ptr = O + b.to(gl.int64) * f_sb + head_o[:, None] * f_sh + HALF * G_HALF + (u_o % 2)[:, None] * 128
        gl.store(o_ptr + cols[None, :], out.to(O.dtype.element_ty), mask=((u_o < u_hi) & (head_o < H))[:, None])
        if HALF == 0:
            first = (u < u_hi) & (head < H) & (u % 2 == 0)
            gl.store(LSE + b * H + head, (m + gl.log2(denom)) * 0.6931471805599453, mask=first)


@gluon.jit
def _finish_group(base, seqlen, scalars, merge, b, s, hg, HALF: gl.constexpr, BLOCK_H: gl.constexpr,
                  S_PAD: gl.constexpr, UPI: gl.constexpr, WU: gl.constexpr):
    """Every consumer warpgroup of every split arrives (an empty split too), then each merges its share."""
    _group_barrier(_group_word(merge[0]), base, (s == 0) & (HALF == 0), 2 * merge[5])
    _merge_half(seqlen, scalars, merge, b, s, hg, HALF, BLOCK_H, S_PAD, UPI, WU)


@gluon.jit
def _consumer_start(scalars, merge, BLOCK_N: gl.constexpr, FUSED: gl.constexpr):
    """What both consumer warpgroups start from: the program's bounds and, fused, its group's barrier base."""
    b, s, hg, start, end, n_tiles, seqlen = _bounds(scalars[0], scalars[1], BLOCK_N)
    return b, s, hg, start, end, n_tiles, seqlen, _group_base(merge, FUSED)


@gluon.jit
def _g_score(descs, smem, bars, scalars, merge, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr,
             STAGES: gl.constexpr, SINGLE: gl.constexpr, FUSED: gl.constexpr, S_PAD: gl.constexpr,
             UPI: gl.constexpr, MERGE_WU: gl.constexpr, TMA_STORE: gl.constexpr,
             DEVICE_DESC: gl.constexpr):
    """Warpgroup 0: scores each tile, runs the online softmax, hands p and the rescale factors to warpgroup 1
    through shared memory, and multiplies the first 256 value columns itself (p straight from registers).

    Only this warpgroup reads q, so after its last score product q's buffer is free: it stages the output
    there (columns 0-255 here, 256-511 for warpgroup 1 once the last hand-off has arrived).
    """
    # built while the first tile is in flight: only the store at the end reads it
    o_desc = _o_descriptor(descs, BLOCK_H, DEVICE_DESC, TMA_STORE)
    q_smem, qr_smem, c_smem, r_smem, p_smem, x_smem = smem
    q_bar, ready, empty, p_ready, p_free = bars
    b, s, hg, start, end, n_tiles, seqlen, base = _consumer_start(scalars, merge, BLOCK_N, FUSED)
    H, qk_scale, LSE_OUT, l_sb, l_sh, l_ss = scalars[2], scalars[4], scalars[6], scalars[10], scalars[11], scalars[12]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, G_HALF, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    acc = gl.zeros([BLOCK_H, G_HALF], gl.float32, o_layout)
    m_i = gl.full([BLOCK_H], -float("inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_H], gl.float32, row_s)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(ready.index(0), 0)
    for j in range(n_tiles):
        stage = j % STAGES
        mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
        c = c_smem.index(stage)
        sc = warpgroup_mma(q_smem, c.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        sc = warpgroup_mma(qr_smem, r_smem.index(stage).permute((1, 0)), sc, is_async=True)
        sc = warpgroup_mma_wait(0, deps=[sc]) * qk_scale
        pb, alpha, m_i, l_i = _softmax_step(sc, m_i, l_i, end - (start + j * BLOCK_N), c, BLOCK_N,
                                            s_layout)
        _hand_off(pb, alpha, p_smem, x_smem, p_ready, p_free, j)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        acc = warpgroup_mma(gl.convert_layout(pb, p_layout), c.slice(0, G_HALF, dim=1), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(empty.index(stage), count=1)
    if n_tiles > 0:
        l_safe = gl.where(l_i > 0.0, l_i, 1.0)
        inv_l = 1.0 / l_safe
        # The last hand-off: 1/l for warpgroup 1's normalisation (and leave to write its half of q's buffer).
        mbarrier.wait(p_free, (n_tiles & 1) ^ 1)
        x_smem.store(inv_l)
        gl.thread_barrier()
        mbarrier.arrive(p_ready, count=1)
        _store_half(acc, gl.convert_layout(inv_l, row_o), q_smem.slice(0, G_HALF, dim=1), scalars, o_desc, b, s,
                    hg, 0, BLOCK_H, TMA_STORE)
        lse2 = m_i + gl.log2(l_safe)
        if SINGLE:
            lse2 = lse2 * 0.6931471805599453
        offs_h = hg * BLOCK_H + gl.arange(0, BLOCK_H, layout=row_s)
        gl.store(LSE_OUT + b * l_sb + offs_h * l_sh + s * l_ss, lse2, mask=offs_h < H)
    if FUSED:
        _finish_group(base, seqlen, scalars, merge, b, s, hg, 0, BLOCK_H, S_PAD, UPI, MERGE_WU)


@gluon.jit
def _g_value(descs, smem, bars, scalars, merge, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr,
             STAGES: gl.constexpr, SINGLE: gl.constexpr, FUSED: gl.constexpr, S_PAD: gl.constexpr,
             UPI: gl.constexpr, MERGE_WU: gl.constexpr, TMA_STORE: gl.constexpr,
             DEVICE_DESC: gl.constexpr):
    """Warpgroup 1: the value columns 256-511, with p read from shared memory as the MMA's A operand."""
    o_desc = _o_descriptor(descs, BLOCK_H, DEVICE_DESC, TMA_STORE)
    q_smem, c_smem, p_smem, x_smem = smem[0], smem[2], smem[4], smem[5]
    ready, empty, p_ready, p_free = bars[1], bars[2], bars[3], bars[4]
    b, s, hg, start, end, n_tiles, seqlen, base = _consumer_start(scalars, merge, BLOCK_N, FUSED)
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, G_HALF, 16])
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    acc = gl.zeros([BLOCK_H, G_HALF], gl.float32, o_layout)
    mbarrier.wait(ready.index(0), 0)
    for j in range(n_tiles):
        stage = j % STAGES
        mbarrier.wait(ready.index(stage), (j // STAGES) & 1)
        c = c_smem.index(stage)
        valid = end - (start + j * BLOCK_N)
        if valid < BLOCK_N:
            _zero_rows(c, valid, 1, BLOCK_N)
        mbarrier.wait(p_ready, j & 1)
        acc = acc * x_smem.load(row_o)[:, None]
        acc = warpgroup_mma(p_smem, c.slice(G_HALF, G_HALF, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(p_free, count=1)
        mbarrier.arrive(empty.index(stage), count=1)
    if n_tiles > 0:
        mbarrier.wait(p_ready, n_tiles & 1)
        _store_half(acc, x_smem.load(row_o), q_smem.slice(G_HALF, G_HALF, dim=1), scalars, o_desc, b, s, hg,
                    1, BLOCK_H, TMA_STORE)
    if FUSED:
        _finish_group(base, seqlen, scalars, merge, b, s, hg, 1, BLOCK_H, S_PAD, UPI, MERGE_WU)


@gluon.jit
def _g_load_w(descs, smem, bars, scalars, pages, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr,
              STAGES: gl.constexpr, PAGED: gl.constexpr, PDL: gl.constexpr, DEVICE_DESC: gl.constexpr):
    _g_load(descs, smem, bars, scalars, pages, BLOCK_N, BLOCK_H, STAGES, PAGED, DEVICE_DESC)
    if PDL:
        # Stage 2 may be scheduled now: its programs wait for this grid's results in griddepcontrol.wait, and
        # meanwhile their launch is off the critical path.
        gl.inline_asm_elementwise("mov.u32 $0, 0; griddepcontrol.launch_dependents;", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _mla_split_attend_ws(q_desc, kv_desc, o_desc, SEQLENS, OUT, LSE_OUT, qk_scale, SYNC, O, LSE, BT,
                         split_len, H, N, o_sb, o_sh, o_ss, l_sb, l_sh, l_ss, f_sb, f_sh, num_splits, bt_stride,
                         PS, Q_ROWS, KV_ROWS, O_COLS,
                         BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr, STAGES: gl.constexpr,
                         SINGLE: gl.constexpr, CONSUMER_REGS: gl.constexpr, FUSED: gl.constexpr,
                         S_PAD: gl.constexpr, UPI: gl.constexpr, MERGE_WU: gl.constexpr, PDL: gl.constexpr,
                         TMA_STORE: gl.constexpr, PAGED: gl.constexpr, DEVICE_DESC: gl.constexpr):
    """Stage 1 on Hopper: per (head group, split, batch row) a loader warp, a scoring warpgroup and a value
    warpgroup, so each score product runs once on the tensor cores.

    q (72 KB) and two 72 KB tiles fill shared memory, so the partitions talk through mbarriers only: `ready`
    per stage (TMA bytes landed), `empty` per stage (both warpgroups are done with it), and `p_ready` /
    `p_free` around the hand-off of p (8 KB) and the rescale factors from warpgroup 0 to warpgroup 1.
    The three descriptors (q, the cache rows, o) have 64-column boxes, each serving a 512-column and a 64-column
    part; with PAGED the cache is [pages * PS, 576] rows and the loader finds each tile's page in BT. With
    DEVICE_DESC the three arrive as base pointers and each program builds its descriptors (q [Q_ROWS, 576], the
    cache [KV_ROWS, 576], o [Q_ROWS, O_COLS]) in Triton's global scratch: no host encoding, and a launch of
    plain integers. Each partition builds the ones it uses as it starts, the loader q's and the cache's and each
    consumer o's, so that two builds, not three, stand before the first tile: do_bench (L2 flushed) at M1, eager,
    19.2 / 19.1 us against 20.3 / 19.5 with all three at the kernel's top (H200, 2026-12-02).
    """
    h_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 64], gl.bfloat16)
    n_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.bfloat16)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, G_LAT],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_H, G_LAT], gl.bfloat16))
    qr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, G_ROPE], h_layout)
    c_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, G_LAT],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_N, G_LAT], gl.bfloat16))
    r_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, G_ROPE], n_layout)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16))
    x_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    descs = (q_desc, kv_desc, o_desc, Q_ROWS, KV_ROWS, O_COLS)
    smem = (q_smem, qr_smem, c_smem, r_smem, p_smem, x_smem)
    bars = (q_bar, ready, empty, p_ready, p_free)
    scalars = (SEQLENS, split_len, H, N, qk_scale, OUT, LSE_OUT, o_sb, o_sh, o_ss, l_sb, l_sh, l_ss)
    merge = (SYNC, O, LSE, f_sb, f_sh, num_splits)
    pages = (BT, bt_stride, PS)
    # Constexprs stay constexprs only when written into each partition's argument tuple.
    gl.warp_specialize([
        (_g_score, (descs, smem, bars, scalars, merge, BLOCK_N, BLOCK_H, STAGES, SINGLE, FUSED, S_PAD, UPI,
                    MERGE_WU, TMA_STORE, DEVICE_DESC)),
        (_g_value, (descs, smem, bars, scalars, merge, BLOCK_N, BLOCK_H, STAGES, SINGLE, FUSED, S_PAD, UPI,
                    MERGE_WU, TMA_STORE, DEVICE_DESC)),
        (_g_load_w, (descs, smem, bars, scalars, pages, BLOCK_N, BLOCK_H, STAGES, PAGED, PDL, DEVICE_DESC)),
    ], [4, 1], [CONSUMER_REGS, 24])


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    """Multiprocessors to fill; the CPU interpreter has none, so use a small number there."""
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def resolve(config: dict | None = None) -> dict:
    """CONFIG with a caller's overrides on top; an unknown key fails loudly (values are the caller's to choose).

    Lets a sweep run several variants in one process (each call says its own config) without touching CONFIG.
    """
    merged = dict(CONFIG)
    for key, value in (config or {}).items():
        if key not in TUNABLES:
            raise ValueError(f"mla_splitkv: unknown config key {key!r} (known: {sorted(TUNABLES)})")
        merged[key] = value
    return merged


def split_plan(batch: int, heads: int, n: int, device: torch.device, num_splits: int = 0,
               block_n: int = 0, config: dict | None = None) -> tuple[int, int]:
    """(splits, rows per split) from shapes alone, so the wrapper never waits on the GPU.

    Splits are sized to whole BLOCK_N tiles, and the count is recomputed from that size, so no split past the
    last is ever launched; shorter rows leave their later splits empty, which both stages detect by start >= len.
    The automatic count fills the GPU with about one stage-1 program per SM, counting head groups of BLOCK_H.
    """
    cfg = resolve(config)
    block_n = block_n or cfg["BLOCK_N"]
    if num_splits <= 0:
        num_splits = cfg["num_splits"]
    if num_splits <= 0:
        groups = batch * triton.cdiv(heads, cfg["BLOCK_H"])
        num_splits = max(1, _sm_count(device) // groups)
    tiles = triton.cdiv(n, block_n)
    tiles_per_split = triton.cdiv(tiles, min(num_splits, tiles))
    split_len = tiles_per_split * block_n
    return triton.cdiv(n, split_len), split_len


def partial_buffers(batch: int, heads: int, splits: int, device: torch.device,
                    dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Scratch for stage 1's per-split results: o [B*H*splits, 512] and lse [B*H*splits] fp32 (log2 units).

    forward passes q's dtype for o: each partial is already normalised, so bf16 rounding there adds about 1e-4 to
    the merged o's error, and at B=1 it halves the partial traffic (16.8 MB of fp32 at 128 splits).
    """
    return (torch.empty(batch * heads * splits, D_LATENT, dtype=dtype, device=device),
            torch.empty(batch * heads * splits, dtype=torch.float32, device=device))


_LOAD_MODES = {"masked": 0, "peeled": 1, "tma": 2}


def tma_ok(kv_cache: torch.Tensor) -> bool:
    """Whether the cache can be viewed as [rows, 576] for TMA (B*N rows, or pages * page size): contiguous, and
    16-byte aligned as TMA needs.

    The default load mode is "tma"; a cache that fails this (a strided view, an odd offset) takes the "peeled"
    path, which reads the same full tiles through plain pointers, instead of failing the call.
    """
    batch, n, width = kv_cache.shape
    contiguous = kv_cache.stride(2) == 1 and kv_cache.stride(1) == width and (batch == 1 or
                                                                             kv_cache.stride(0) == n * width)
    return contiguous and kv_cache.data_ptr() % 16 == 0 and (width * kv_cache.element_size()) % 16 == 0


# Registers: the kernel launches with 168 a thread for its 12 warps (the loader's partition rounds up to a
# warpgroup), then the loader drops to 24 and each consumer warpgroup rises to 240 (its 64x256 fp32 accumulator
# alone is 128): 168 * 384 = 240 * 256 + 24 * 128.
GLUON_MAXNREG = 168
# (BLOCK_N, num_stages) rings that fit beside q in shared memory: 64 x 2 ships; 32-row tiles split M1's one tile
# per program in two, so the second half's load overlaps the first half's math.
GLUON_TILES = ((64, 2), (32, 2), (32, 3), (32, 4))
GLUON_CONSUMER_REGS = 240


def gluon_ok(q: torch.Tensor, kv_cache: torch.Tensor, config: dict | None = None, paged: bool = False) -> bool:
    """Whether the warp-specialised Gluon stage 1 can run: a Hopper GPU (not the interpreter), bf16 inputs, q
    contiguous, the cache viewable as TMA rows, and a tile ring it was built for (GLUON_TILES, 64 heads a program).
    A paged cache also needs pages that hold whole tiles (page size a multiple of BLOCK_N: 64 does, 1 does not), as
    the loader reads a tile from one page. Anything else takes the tl stage 1, which runs everywhere."""
    cfg = resolve(config)
    if not q.is_cuda or triton.knobs.runtime.interpret:
        return False
    if torch.cuda.get_device_capability(q.device)[0] != 9 or q.dtype != torch.bfloat16:
        return False
    if cfg["BLOCK_H"] != 64 or (cfg["BLOCK_N"], cfg["num_stages"]) not in GLUON_TILES:
        return False
    if paged and kv_cache.shape[1] % cfg["BLOCK_N"] != 0:
        return False
    batch, heads, _ = q.shape
    # A TMA box may not be taller than the tensor it reads: a tiny cache (N = 1) or a q of fewer than 64 rows in
    # all stays on the tl path.
    big_enough = kv_cache.shape[0] * kv_cache.shape[1] >= cfg["BLOCK_N"] and batch * heads >= 64
    return kv_cache.dtype == q.dtype and q.is_contiguous() and tma_ok(kv_cache) and big_enough


@functools.lru_cache(maxsize=None)
def _smem_layout(rows: int, cols: int):
    """The swizzled shared-memory layout of a [rows, cols] bf16 block. Cached: working it out costs about 9 us of
    Python."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.bfloat16)


# The fused merge's barrier word per (batch row, head group). Zero is a valid start and the kernel leaves every word
# a multiple of G_SYNC_ROUND, so they are made once per device (outside any graph capture) and reused. Each call
# takes the next of _SYNC_SLOTS sets in turn, so calls in flight at once on different streams (or graphs captured at
# different calls) use different words. A captured graph keeps its set, and CUDA never runs one graph exec concurrently
# with itself (its launches are ordered), so the one way to share words is two graphs captured a multiple of
# _SYNC_SLOTS calls apart and replayed at the same time on two streams.
_SYNC_SLOTS = 64
# MERGE "auto" fuses from this many splits. H200, same run (graph us, mla_variants.py, 2026-11-30): fused vs
# two kernels M1 (128 splits) 14.38 vs 14.74, M2 (64) 15.31 vs 17.03, M3 (4) 84.57 vs 83.31. With few splits the
# stage-2 kernel is short, and in the fused kernel a group's merge reads compete with other groups' tile loads.
FUSED_MIN_SPLITS = 16
_SYNC_GROUPS = 512
_SYNC_WORDS: dict = {}
_SYNC_TURN = itertools.count()
_SLOT_BYTES = _SYNC_GROUPS * 4


def _sync_words(device: torch.device):
    """This device's barrier words [_SYNC_SLOTS, _SYNC_GROUPS], or None while a graph is being captured before they
    exist: allocating them inside the capture would put them in that graph's memory pool."""
    words = _SYNC_WORDS.get(device)
    if words is None and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        words = _SYNC_WORDS[device] = torch.zeros(_SYNC_SLOTS, _SYNC_GROUPS, dtype=torch.int32, device=device)
    return words


def _sync_slot(plan: "_Plan", as_address: bool):
    """The next slot of the plan's device's barrier words, as a tensor (a launch through the JIT function) or its
    address."""
    slot = next(_SYNC_TURN) % _SYNC_SLOTS
    return plan.sync_base + slot * _SLOT_BYTES if as_address else _sync_words(plan.device)[slot]


def fused_ok(batch: int, heads: int, splits: int, device: torch.device, config: dict | None = None) -> bool:
    """Whether the Gluon stage 1 merges the splits itself: MERGE "fused" (or "auto" from FUSED_MIN_SPLITS splits),
    more than one split and at most 128 (one [splits, 128] tile per merge step), and the whole grid resident at
    once (one program per multiprocessor: it needs 225 KB of shared memory), which the cooperative launch then
    guarantees."""
    cfg = resolve(config)
    groups = batch * triton.cdiv(heads, cfg["BLOCK_H"])
    wanted = cfg["MERGE"] == "fused" or (cfg["MERGE"] == "auto" and splits >= FUSED_MIN_SPLITS)
    return wanted and 1 < splits <= 128 and groups <= _SYNC_GROUPS and groups * splits <= _sm_count(device)


def tma_store_ok(heads: int, block_h: int) -> bool:
    """Whether stage 1 may write its [BLOCK_H, 64] blocks by TMA into o (or the partials) viewed as [B*H, splits*512]
    rows: a head group must not end past its batch row's heads, since a TMA box is clipped at the tensor's edge
    only and would spill into the next row's heads. The buffers are contiguous and aligned (_check_buffers)."""
    return heads % block_h == 0


def merge_tile(splits: int) -> tuple[int, int, int]:
    """The fused merge's step as (S_PAD, UPI, WU): [UPI units, S_PAD splits, 128 columns], with WU warps across
    units. At most 16 units a step: 32 spilled at 4 splits (sm_90 compile, benchmarks/mla_compile_check.py)."""
    s_pad = triton.next_power_of_2(splits)
    upi = min(16, max(1, 128 // s_pad))
    return s_pad, upi, 4 if upi >= 4 else 1


def merge_launch(batch: int, heads: int, splits: int, cfg: dict) -> tuple:
    """The merge kernel's (grid, BLOCK_M, BLOCK_S, BLOCK_D, warps) for a split count; grids have all three
    dimensions, as a compiled kernel's launcher takes them.

    MERGE_HEADS is a ceiling: rows x splits x 32 columns must stay within 8K floats, so at 128 splits (M1) it drops
    to 2 rows while at 4 splits (M3) 8 rows fit. The [rows, splits, BLOCK_D] partial tile stays near 8K floats: 64
    registers a thread at 4 warps, with warps added (up to 8) when a forced MERGE_BLOCK_D makes it bigger.
    """
    block_s = triton.next_power_of_2(splits)
    block_m = min(cfg["MERGE_HEADS"], max(1, 8192 // (block_s * 32)))
    block_d = cfg["MERGE_BLOCK_D"] or max(32, min(D_LATENT, 8192 // (block_s * block_m)))
    warps = min(8, max(4, block_m * block_s * block_d // 2048))
    return (triton.cdiv(batch * heads, block_m), D_LATENT // block_d, 1), block_m, block_s, block_d, warps


class _Address:
    """A device address standing in for a tensor as a TMA descriptor's base. The launcher reads only data_ptr()
    and the JIT binder the dtype, and a cached descriptor must not keep the caller's tensor (a cache of gigabytes)
    alive after the caller has dropped it."""

    def __init__(self, ptr: int, dtype: torch.dtype):
        self.ptr = ptr
        """The address."""
        self.dtype = dtype
        """The element type of the tensor it stands for."""

    def data_ptr(self) -> int:
        """The address, as torch.Tensor.data_ptr gives it."""
        return self.ptr


def _addr(x) -> int:
    """An address from a tensor or an address."""
    return x if isinstance(x, int) else x.data_ptr()


@dataclasses.dataclass
class _Plan:
    """Everything a call decides from its inputs' shapes, strides, dtypes, devices and alignments and the config:
    made once per distinct key (see _plan_for) and reused, so that an eager call does little more host work than
    its launches. After a plan's first call it also holds the compiled kernels that call launched, and later calls
    launch those handles with plain addresses instead of binding their arguments through the JIT functions."""

    cfg: dict
    device: torch.device
    dtype: torch.dtype
    """q's dtype: o's and the partials'."""
    batch: int
    heads: int
    n: int
    """Rows a batch row can hold: N, or the block table's width times the page size."""
    rows: int
    """Rows of the cache viewed as [rows, 576] (B * N, or pages * page size)."""
    page_size: int
    """0 for a contiguous cache."""
    q_strides: tuple
    kv_strides: tuple
    bt_stride: int
    splits: int
    split_len: int
    gluon: bool
    fused: bool
    tma_store: bool
    load: int
    """The tl stage 1's LOAD mode."""
    cached: bool
    """Whether to keep compiled kernels (CONFIG LAUNCH "cached", and not the interpreter, which has none)."""
    grid: tuple
    """Stage 1's grid: (head groups, splits, batch rows)."""
    merge_step: tuple
    """The fused merge's (S_PAD, UPI, WU) (merge_tile), or (1, 1, 1)."""
    merge_launch: tuple
    """The merge kernel's (grid, BLOCK_M, BLOCK_S, BLOCK_D, warps) (merge_launch)."""
    compiled: dict = dataclasses.field(default_factory=dict)
    """Launch name ("gluon", "tl", "merge") -> the compiled kernel its first launch returned."""
    descriptors: dict = dataclasses.field(default_factory=dict)
    """(addresses) -> TMA descriptors over them: a descriptor costs several us of Python to build."""
    fallback: object = None
    """The two-kernel _Plan a fused plan runs when a graph capture comes before the barrier words exist."""
    scratch: object = None
    """The partials' buffer of this plan's eager warm calls (a torch.Tensor of scratch_bytes), made by the first."""
    runners: dict = dataclasses.field(default_factory=dict)
    """Launch name -> its compiled kernel's launcher over the plan's grid (CompiledKernel[grid], made once)."""
    constants: dict = dataclasses.field(default_factory=dict)
    """(launch name, pdl) -> the launch's trailing arguments, which depend on the plan only."""

    graph_twin: object = None
    """DESC "auto": the _Plan (DESC "host") that calls being captured into a graph run instead."""
    raw: dict = dataclasses.field(default_factory=dict)
    """Launch name -> its compiled kernel's _RawLaunch, or None where only the runner can launch it."""
    direct: bool = False
    """Whether every launch of a call has its _RawLaunch."""

    @functools.cached_property
    def device_desc(self) -> bool:
        """Whether the Gluon stage 1 builds its TMA descriptors itself (DESC "device", or "auto" outside a graph
        capture, whose calls take graph_twin)."""
        return self.gluon and self.cfg["DESC"] != "host"

    @functools.cached_property
    def single(self) -> bool:
        return self.splits == 1

    @functools.cached_property
    def launches(self) -> int:
        """Kernels a call launches: stage 1, and the merge unless there is one split or stage 1 merges."""
        return 1 if self.single or self.fused else 2

    @functools.cached_property
    def pdl(self) -> bool:
        """Whether stage 2 launches as a programmatic dependent of stage 1: a Hopper launch attribute, which the
        interpreter neither has nor needs."""
        return bool(self.cfg["PDL"]) and self.device.type == "cuda" and not self.single

    @functools.cached_property
    def lse_offset(self) -> int:
        """Bytes from the partials' buffer to its lse part."""
        return self.batch * self.heads * self.splits * D_LATENT * self.dtype.itemsize

    @functools.cached_property
    def sync_base(self) -> int:
        """The address of the device's barrier words, which a fused plan's calls take slots of (_sync_slot): kept,
        as the words are made once per device and never freed."""
        return _sync_words(self.device).data_ptr()

    @functools.cached_property
    def scratch_ptr(self) -> int:
        """The address of the partials' buffer of eager calls (_scratch)."""
        return _scratch(self, False).data_ptr()

    @functools.cached_property
    def outputs_like(self) -> tuple:
        """Templates of o and lse for a direct call's torch.empty_like, which parses less than torch.empty: one
        element each, expanded to the outputs' shapes (stride 0), so that empty_like makes them contiguous. Made on
        a direct call, never inside a capture (a graph's pool would hold them)."""
        o = torch.empty(1, dtype=self.dtype, device=self.device).expand(self.batch, self.heads, D_LATENT)
        return o, torch.empty(1, dtype=torch.float32, device=self.device).expand(self.batch, self.heads)

    @property
    def ready(self) -> bool:
        """Whether every launch of a call has its compiled kernel, so the call can use addresses throughout."""
        return len(self.compiled) == self.launches

    @property
    def scratch_bytes(self) -> int:
        """One allocation for the partials: o [B*H*splits, 512] in q's dtype, then lse [B*H*splits] fp32."""
        return self.batch * self.heads * self.splits * (D_LATENT * self.dtype.itemsize + 4)


_PLANS: dict = {}
_PLAN_LIMIT = 256
"""Plans kept before the cache starts over: a long run over many shapes stays bounded."""
_DESCRIPTOR_LIMIT = 64
"""Descriptor sets kept per plan (distinct q, cache and output addresses: a rotation of input buffers, a decode
loop whose q the allocator hands out from a few blocks)."""


def _plan_key(q, kv_cache, cache_seqlens, block_table, num_splits: int, split_len: int, config,
              addresses: tuple | None = None) -> tuple:
    """What a plan depends on: every tensor's shape, strides, dtype and device, whether its address is 16-byte
    aligned (Triton specialises pointers on that), the split request and the whole config. Two calls with the same
    key compile to the same kernels with the same integer arguments; only addresses and sm_scale differ.
    `addresses` are q's, the cache's and cache_seqlens' where the caller has them already."""
    bt = None if block_table is None else (block_table.shape, block_table.stride(), block_table.dtype,
                                           block_table.device, block_table.data_ptr() % 16 == 0)
    cfg = tuple(CONFIG.values()) if config is None else tuple(resolve(config).values())
    q_ptr, kv_ptr, sl_ptr = addresses or (q.data_ptr(), kv_cache.data_ptr(), cache_seqlens.data_ptr())
    return (q.shape, q.stride(), q.dtype, q.device, q_ptr % 16 == 0,
            kv_cache.shape, kv_cache.stride(), kv_cache.dtype, kv_cache.device, kv_ptr % 16 == 0,
            cache_seqlens.shape, cache_seqlens.stride(), cache_seqlens.dtype, cache_seqlens.device,
            sl_ptr % 16 == 0, bt, num_splits, split_len, cfg)


def _make_plan(q, kv_cache, cache_seqlens, block_table, num_splits: int, split_len: int, config) -> _Plan:
    """A plan from scratch; split_len > 0 forces (num_splits, split_len) as given (attend_into's callers)."""
    cfg = resolve(config)
    batch, heads, width = q.shape
    if width != D_LATENT + D_ROPE or kv_cache.shape[2] != width:
        raise ValueError(f"mla_splitkv: q and kv_cache rows must be {D_LATENT + D_ROPE} wide, got "
                         f"{tuple(q.shape)} and {tuple(kv_cache.shape)}")
    if cache_seqlens.shape != (batch,) or cache_seqlens.stride(0) != 1:
        raise ValueError(f"mla_splitkv: cache_seqlens must be a contiguous [{batch}], got {tuple(cache_seqlens.shape)}")
    page_size = 0 if block_table is None else kv_cache.shape[1]
    if block_table is None:
        if kv_cache.shape[0] != batch:
            raise ValueError(f"mla_splitkv: kv_cache has {kv_cache.shape[0]} rows of sequences for a batch of {batch}")
        n, bt_stride = kv_cache.shape[1], 0
    else:
        if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.stride(1) != 1:
            raise ValueError(f"mla_splitkv: block_table must be [{batch}, pages] with contiguous rows, got "
                             f"{tuple(block_table.shape)} strides {block_table.stride()}")
        n, bt_stride = block_table.shape[1] * page_size, block_table.stride(0)
    if split_len <= 0:
        num_splits, split_len = split_plan(batch, heads, n, q.device, num_splits, config=cfg)
    gluon = cfg["STAGE1"] == "gluon" and gluon_ok(q, kv_cache, cfg, paged=block_table is not None)
    load = _LOAD_MODES[cfg["LOAD"]]
    if load == 2 and not (tma_ok(kv_cache) and page_size % cfg["BLOCK_N"] == 0):
        load = 1
    fused = gluon and fused_ok(batch, heads, num_splits, q.device, cfg)
    # Host-side triton.cdiv and next_power_of_2 are JIT functions (a few us a call): all of it is worked out here.
    return _Plan(
        cfg=cfg, device=q.device, dtype=q.dtype, batch=batch, heads=heads, n=n,
        rows=kv_cache.shape[0] * kv_cache.shape[1], page_size=page_size, q_strides=q.stride(),
        kv_strides=kv_cache.stride(), bt_stride=bt_stride, splits=num_splits, split_len=split_len, gluon=gluon,
        fused=fused, tma_store=gluon and cfg["STORE"] == "tma" and tma_store_ok(heads, cfg["BLOCK_H"]), load=load,
        cached=cfg["LAUNCH"] == "cached" and not triton.knobs.runtime.interpret,
        grid=(triton.cdiv(heads, cfg["BLOCK_H"]), num_splits, batch),
        merge_step=merge_tile(num_splits) if fused else (1, 1, 1),
        merge_launch=merge_launch(batch, heads, num_splits, cfg))


def _plan_for(q, kv_cache, cache_seqlens, block_table, num_splits: int, config, capturing: bool = False,
              addresses: tuple | None = None) -> _Plan:
    """The cached plan for these inputs, made on first sight of their key. A call being captured into a graph
    under DESC "auto" takes the plan's graph_twin, with host-made descriptors: replays pay no host cost, and the
    device-made ones add 1.3-3.4 us of GPU time a call (H200, 2026-12-01). A fused plan met inside a graph capture
    before its device's barrier words exist runs as two kernels instead (its fallback)."""
    key = _plan_key(q, kv_cache, cache_seqlens, block_table, num_splits, 0, config, addresses)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _PLAN_LIMIT:
            _PLANS.clear()
        plan = _PLANS[key] = _make_plan(q, kv_cache, cache_seqlens, block_table, num_splits, 0, config)
    if capturing and plan.gluon and plan.cfg["DESC"] == "auto":
        if plan.graph_twin is None:
            plan.graph_twin = _variant(plan, cfg={**plan.cfg, "DESC": "host"})
        plan = plan.graph_twin
    if plan.fused and capturing and _sync_words(plan.device) is None:  # outside a capture the words get made
        if plan.fallback is None:
            plan.fallback = _variant(plan, fused=False, merge_step=(1, 1, 1))
        return plan.fallback
    return plan


def _variant(plan: _Plan, **changes) -> _Plan:
    """A plan for the same inputs with `changes`, and none of the kernels, descriptors, buffers or arguments the
    original has kept (they belong to its own launches)."""
    return dataclasses.replace(plan, compiled={}, descriptors={}, scratch=None, runners={}, constants={},
                               fallback=None, graph_twin=None, raw={}, direct=False, **changes)


def _descriptors(plan: _Plan, q, kv_cache, out, base) -> tuple:
    """The TMA descriptors of one call over base(tensor or address, [rows, columns]). Gluon stage 1: q, the cache rows
    and o (or the partials; q's stands in when o is stored without TMA), all in 64-column boxes. tl stage 1 with
    LOAD "tma": the cache rows in a 512-column and a 64-column box."""
    cfg, width = plan.cfg, D_LATENT + D_ROPE
    kv_shape = [plan.rows, width]
    if plan.gluon:
        block_h = cfg["BLOCK_H"]

        def desc(x, shape, rows):
            return GluonDescriptor(base(x, shape), shape, [shape[1], 1], [rows, 64], _smem_layout(rows, 64))

        q_desc = desc(q, [plan.batch * plan.heads, width], block_h)
        o_desc = (desc(out, [plan.batch * plan.heads, plan.splits * D_LATENT], block_h) if plan.tma_store
                  else q_desc)
        return q_desc, desc(kv_cache, kv_shape, cfg["BLOCK_N"]), o_desc
    rows = base(kv_cache, kv_shape)
    return (TensorDescriptor(rows, kv_shape, [width, 1], [cfg["BLOCK_N"], D_LATENT]),
            TensorDescriptor(rows, kv_shape, [width, 1], [cfg["BLOCK_N"], D_ROPE]))


def _descriptor_set(plan: _Plan, q, kv_cache, out) -> tuple:
    """The call's descriptors. A caching plan keeps them per address, over _Address bases (building one costs
    several us of Python); otherwise (the interpreter, which reads through the base, or LAUNCH "jit") they are
    built over views of the tensors themselves for this call only. Where the Gluon kernel builds its own
    (plan.device_desc), it gets q, the cache and o (or the partials) themselves."""
    if plan.device_desc:
        return q, kv_cache, out
    if not plan.cached:
        return _descriptors(plan, q, kv_cache, out, lambda t, shape: t.as_strided(shape, (shape[1], 1)))
    key = (_addr(q) if plan.gluon else 0, _addr(kv_cache), _addr(out) if plan.tma_store else 0)
    descs = plan.descriptors.get(key)
    if descs is None:
        if len(plan.descriptors) >= _DESCRIPTOR_LIMIT:
            plan.descriptors.clear()
        descs = plan.descriptors[key] = _descriptors(plan, q, kv_cache, out,
                                                     lambda x, shape: _Address(_addr(x), plan.dtype))
    return descs


@dataclasses.dataclass(frozen=True)
class _RawLaunch:
    """A compiled kernel's launch without Triton's runner around it. The runner (CompiledKernel[grid]) looks up the
    device and the stream, builds launch metadata for the launch hooks and calls them, and its launcher wrapper asks
    Triton's allocator hook for global scratch: about 4 us of an eager M1 call's 23 (H200, 2026-12-01). Where no
    launch hook is set (_hooks_idle), a call makes the same C launch itself, with the stream and scratch it has."""

    launch: object
    """What CudaLauncher.__call__ calls: the launcher module's C function (or Triton's wrapper that expands host
    TMA descriptors)."""
    grid: tuple
    function: int
    """The loaded kernel's CUfunction handle."""
    packed: tuple
    """The compiled kernel's packed metadata (warps, CTAs, shared memory)."""
    cooperative: bool
    pdl: bool
    scratch_bytes: int
    """Global scratch the whole grid needs (device-made TMA descriptors), 0 for none."""


def _raw_launch(compiled, grid: tuple) -> _RawLaunch | None:
    """The raw launch of a compiled kernel over grid; None where its launcher is not the CudaLauncher known here
    (another Triton, a test's stand-in) or wants profiling scratch (an instrumented build), so the runner stays."""
    launcher = getattr(compiled, "run", None)
    launch = getattr(launcher, "launch", None)
    scratch, align = getattr(launcher, "global_scratch_size", None), getattr(launcher, "global_scratch_align", 1)
    if launch is None or scratch is None or getattr(launcher, "profile_scratch_size", 1) != 0:
        return None
    if align > 512:  # torch's CUDA allocator aligns every block to 512 B
        return None
    programs = grid[0] * grid[1] * grid[2] * launcher.num_ctas
    return _RawLaunch(launch, grid, compiled.function, compiled.packed_metadata, launcher.launch_cooperative_grid,
                      launcher.launch_pdl, programs * scratch)


def _hooks_idle() -> bool:
    """Whether Triton has no launch hook to call (its hook chains are empty: a profiler such as proton fills them),
    so that a raw launch skips nothing a runner would do."""
    runtime = triton.knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return not (getattr(enter, "calls", enter) or getattr(leave, "calls", leave))


def _current_stream(device: torch.device) -> int:
    """The raw handle of device's current stream, read as Triton's own launcher reads it before every launch:
    torch.cuda.current_stream() builds a Stream object for it, 4.5 us (H200, 2026-12-01)."""
    return torch._C._cuda_getCurrentRawStream(device.index)


def _raw_call(plan: _Plan, raw: _RawLaunch, stream: int, args: tuple) -> None:
    """A raw launch on `stream`, as CudaLauncher.__call__ makes it with no launch hook: the global scratch from the
    stream's buffer, no profiling scratch, no launch metadata."""
    scratch = _stream_scratch(plan.device, stream, raw.scratch_bytes).data_ptr() if raw.scratch_bytes else None
    raw.launch(*raw.grid, stream, raw.function, raw.cooperative, raw.pdl, scratch, None, raw.packed, None, None, None,
               *args)


def _launch(plan: _Plan, name: str, kernel, grid: tuple, args: tuple, options: dict, stream=None) -> None:
    """One launch: raw (_RawLaunch) when the call has the stream, else through the plan's compiled kernel once it
    has one (args then hold addresses; its launcher reads all three grid dimensions), else through the JIT function,
    keeping the compiled kernel it returns (the interpreter returns none)."""
    if stream is not None:
        _raw_call(plan, plan.raw[name], stream, args)
        return
    runner = plan.runners.get(name)
    if runner is not None:
        runner(*args)
        return
    compiled = kernel[grid](*args, **options)
    if plan.cached and compiled is not None:
        plan.compiled[name] = compiled
        plan.runners[name] = compiled[grid]
        plan.raw[name] = _raw_launch(compiled, grid)
        plan.direct = len(plan.raw) == plan.launches and None not in plan.raw.values()


def _gluon_constants(plan: _Plan, pdl: bool) -> tuple:
    """_mla_split_attend_ws's arguments from split_len on: the plan's integers and constexprs, made once a plan."""
    key = ("gluon", pdl)
    constants = plan.constants.get(key)
    if constants is None:
        cfg, heads, splits = plan.cfg, plan.heads, plan.splits
        if plan.single:
            o_strides, l_strides = (heads * D_LATENT, D_LATENT, 0), (heads, 1, 0)
        else:
            o_strides = (heads * splits * D_LATENT, splits * D_LATENT, D_LATENT)
            l_strides = (heads * splits, splits, 1)
        s_pad, upi, wu = plan.merge_step
        constants = plan.constants[key] = (
            plan.split_len, heads, plan.n, *o_strides, *l_strides, heads * D_LATENT, D_LATENT, splits,
            plan.bt_stride, max(plan.page_size, 1), plan.batch * heads, plan.rows, splits * D_LATENT,
            cfg["BLOCK_N"], cfg["BLOCK_H"], cfg["num_stages"], plan.single, GLUON_CONSUMER_REGS, plan.fused, s_pad,
            upi, wu, pdl and not plan.fused, plan.tma_store, plan.page_size > 0, plan.device_desc)
    return constants


def _gluon_args(plan: _Plan, descs, cache_seqlens, block_table, qk_scale: float, out, lse_out, sync, o, lse,
                pdl: bool) -> tuple:
    """_mla_split_attend_ws's arguments, in order: the call's own (descriptors or bases, addresses, the scale)
    first, then the plan's (_gluon_constants); out / lse_out are o and lse with one split, else the partials."""
    if sync is None:
        sync, o, lse = lse_out, out, lse_out
    table = block_table if plan.page_size > 0 else cache_seqlens
    return (*descs, cache_seqlens, out, lse_out, qk_scale, sync, o, lse, table, *_gluon_constants(plan, pdl))


def _launch_gluon_stage1(plan: _Plan, q, kv_cache, cache_seqlens, block_table, qk_scale: float, out, lse_out,
                         sync=None, o=None, lse=None, pdl: bool = False, stream=None) -> None:
    """Stage 1 through the Gluon kernel: one program per (head group, split, batch row) with a loader warp and two
    consumer warpgroups. With `sync` (a slot of barrier words) the kernel merges its splits itself into o and lse
    after a barrier per (batch row, head group), under a cooperative launch; otherwise stage 2 runs after."""
    descs = _descriptor_set(plan, q, kv_cache, out)
    args = _gluon_args(plan, descs, cache_seqlens, block_table, qk_scale, out, lse_out, sync, o, lse, pdl)
    _launch(plan, "gluon", _mla_split_attend_ws, plan.grid, args, _GLUON_OPTIONS[sync is not None], stream)


_GLUON_OPTIONS = {cooperative: {"num_warps": 4, "maxnreg": GLUON_MAXNREG, "launch_cooperative_grid": cooperative}
                  for cooperative in (False, True)}
"""The Gluon stage 1's launch options, by whether the launch is cooperative (the fused merge's barrier)."""


def _launch_tl_stage1(plan: _Plan, q, kv_cache, cache_seqlens, block_table, qk_scale: float, o, lse, o_part,
                      lse_part, pdl: bool, stream=None) -> None:
    """Stage 1 through the tl kernel: any device, the CPU interpreter included."""
    cfg, paged = plan.cfg, plan.page_size > 0
    descs = _descriptor_set(plan, None, kv_cache, None) if plan.load == 2 else (None, None)
    args = (q, kv_cache, cache_seqlens, o, lse, o_part, lse_part, *descs, block_table if paged else None, qk_scale,
            plan.split_len, plan.q_strides[0], plan.q_strides[1], plan.kv_strides[0], plan.kv_strides[1],
            plan.heads * D_LATENT, D_LATENT, plan.bt_stride, plan.heads, plan.n, max(plan.page_size, 1),
            plan.splits, D_LATENT, D_ROPE, cfg["BLOCK_H"], cfg["BLOCK_N"], plan.single, cfg["LAZY_RESCALE"],
            plan.load, pdl, paged)
    _launch(plan, "tl", _mla_split_attend, plan.grid, args,
            {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}, stream)


def _launch_merge(plan: _Plan, cache_seqlens, o, lse, o_part, lse_part, pdl: bool, stream=None) -> None:
    """Stage 2: the splits' partials merged into o and lse."""
    grid, warps = plan.merge_launch[0], plan.merge_launch[4]
    options = {"num_warps": warps, **({"launch_pdl": True} if pdl else {})}
    _launch(plan, "merge", _mla_merge_splits, grid, _merge_args(plan, cache_seqlens, o, lse, o_part, lse_part, pdl),
            options, stream)


def _merge_args(plan: _Plan, cache_seqlens, o, lse, o_part, lse_part, pdl: bool) -> tuple:
    """_mla_merge_splits's arguments, in order."""
    block_m, block_s, block_d = plan.merge_launch[1:4]
    return (o_part, lse_part, cache_seqlens, o, lse, plan.split_len, plan.heads * D_LATENT, D_LATENT, plan.heads,
            plan.batch * plan.heads, plan.splits, D_LATENT, block_m, block_s, block_d, pdl)


def _run(plan: _Plan, q, kv_cache, cache_seqlens, block_table, sm_scale, o, lse, o_part, lse_part,
         stream=None) -> None:
    """One call's launches. The tensor arguments are tensors while the plan is not ready (its launches go through
    the JIT functions) and plain addresses once it is (they go through the compiled kernels: raw launches on
    `stream` where the caller gives it, plan.direct)."""
    qk_scale = float(sm_scale) * LOG2E
    pdl = plan.pdl
    if plan.gluon:
        if plan.device_desc and stream is None:
            # The kernel's descriptors live in Triton's global scratch, which its launcher asks this hook for. A
            # context variable: set on every call, since a thread starts without it.
            triton.set_allocator(_global_scratch)
        sync = _sync_slot(plan, isinstance(o, int)) if plan.fused else None
        _launch_gluon_stage1(plan, q, kv_cache, cache_seqlens, block_table, qk_scale, o_part, lse_part, sync, o,
                             lse, pdl, stream)
    else:
        _launch_tl_stage1(plan, q, kv_cache, cache_seqlens, block_table, qk_scale, o, lse, o_part, lse_part, pdl,
                          stream)
    if plan.launches == 2:
        _launch_merge(plan, cache_seqlens, o, lse, o_part, lse_part, pdl, stream)


def _direct(plan: _Plan, addresses: tuple, block_table, sm_scale, o: torch.Tensor, lse: torch.Tensor) -> None:
    """A direct plan's eager call (plan.direct, no hook, not capturing): _run's launches, raw on the current
    stream, with the partials' address kept on the plan. A Gluon plan's (the Hopper path) are made here without
    _run's layers, from the same argument builders: about 1 us of an M1 call's host time."""
    stream = _current_stream(plan.device)
    o, lse = o.data_ptr(), lse.data_ptr()
    o_part, lse_part = (o, lse) if plan.single else (plan.scratch_ptr, plan.scratch_ptr + plan.lse_offset)
    block_table = None if block_table is None else block_table.data_ptr()
    if not plan.gluon:
        _run(plan, *addresses, block_table, sm_scale, o, lse, o_part, lse_part, stream)
        return
    q, kv_cache, cache_seqlens = addresses
    pdl = plan.pdl
    sync = _sync_slot(plan, True) if plan.fused else None
    descs = (q, kv_cache, o_part) if plan.device_desc else _descriptor_set(plan, q, kv_cache, o_part)
    _raw_call(plan, plan.raw["gluon"], stream, _gluon_args(plan, descs, cache_seqlens, block_table,
                                                          float(sm_scale) * LOG2E, o_part, lse_part, sync, o, lse,
                                                          pdl))
    if plan.launches == 2:
        _raw_call(plan, plan.raw["merge"], stream, _merge_args(plan, cache_seqlens, o, lse, o_part, lse_part, pdl))


def _scratch(plan: _Plan, capturing: bool) -> torch.Tensor:
    """The partials' buffer of a warm call. Eager calls of a plan share one, kept on the plan: calls on one stream
    run one after another, so the next call's stage 1 cannot overwrite partials a merge still reads (an allocation
    a call costs 5-8 us of host time on the H200 lease's host). A call being captured into a graph gets its own,
    from the graph's pool, so a graph never shares scratch with eager calls or with other graphs. As with a
    FlashInfer workspace, eager calls of one shape on two streams at once must not overlap."""
    if capturing:
        return torch.empty(plan.scratch_bytes, dtype=torch.uint8, device=plan.device)
    if plan.scratch is None:
        plan.scratch = torch.empty(plan.scratch_bytes, dtype=torch.uint8, device=plan.device)
    return plan.scratch


_GLOBAL_SCRATCH: dict = {}
"""(device index, stream handle) -> the global-scratch buffer of that stream's eager launches."""


def _global_scratch(size: int, alignment: int, stream):
    """Triton's allocator hook (triton.set_allocator): the global scratch a launch needs, here the Gluon stage 1's
    device-made descriptors (128 B per descriptor and program). Eager launches on one stream run one after another,
    so each stream keeps one buffer, grown when a launch needs more; a launch being captured into a graph gets its
    own from the graph's pool, as _scratch does. Any other Triton kernel in the process gets the same service."""
    if torch.cuda.is_current_stream_capturing():
        return torch.empty(size, dtype=torch.uint8, device="cuda")
    return _stream_scratch(torch.device("cuda", torch.cuda.current_device()), stream, size)


def _stream_scratch(device: torch.device, stream: int, size: int) -> torch.Tensor:
    """The global-scratch buffer of eager launches on one stream of device, grown when a launch needs more. Stream
    handles are per device, and the default stream is 0 on every device."""
    key = (device.index, stream)
    buffer = _GLOBAL_SCRATCH.get(key)
    if buffer is None or buffer.numel() < size:
        buffer = _GLOBAL_SCRATCH[key] = torch.empty(max(size, 1 << 16), dtype=torch.uint8, device=device)
    return buffer


def _check_buffers(plan: _Plan, o, lse, o_part, lse_part) -> None:
    """attend_into's caller-owned buffers must be what the kernels write as: contiguous, of the plan's sizes."""
    rows = plan.batch * plan.heads
    wanted = [(o, rows * D_LATENT), (lse, rows)]
    if not plan.single:
        wanted += [(o_part, rows * plan.splits * D_LATENT), (lse_part, rows * plan.splits)]
    for t, numel in wanted:
        if not (t.is_contiguous() and t.numel() == numel and t.data_ptr() % 16 == 0):
            raise ValueError(f"mla_splitkv: a buffer of {numel} contiguous, 16-byte aligned elements was expected, "
                             f"got {tuple(t.shape)} strides {t.stride()}")


def attend_into(q, kv_cache, cache_seqlens, sm_scale, o, lse, o_part, lse_part, splits: int, split_len: int,
                config: dict | None = None, block_table=None):
    """Launch stage 1 (and stage 2 when splits > 1) into caller-owned buffers, with the split plan given.

    Separate from forward so tests can hand in NaN-filled scratch and prove that empty splits are never read. Its
    plan is made for the call and not cached: the buffers are the caller's.
    """
    plan = _make_plan(q, kv_cache, cache_seqlens, block_table, splits, split_len, config)
    if plan.fused and _sync_words(plan.device) is None:
        plan = dataclasses.replace(plan, fused=False, merge_step=(1, 1, 1))
    if plan.single:
        o_part, lse_part = o, lse
    _check_buffers(plan, o, lse, o_part, lse_part)
    _run(plan, q, kv_cache, cache_seqlens, block_table, sm_scale, o, lse, o_part, lse_part)


def forward(q, kv_cache, cache_seqlens, sm_scale, block_table=None, num_splits: int = 0, config: dict | None = None):
    """o [B,H,512] in q's dtype and lse [B,H] fp32; kv_cache is [B,N,576], or with block_table [B, pages] int32
    [pages, page_size, 576]. num_splits > 0 forces the split count (tests, sweeps), and config overrides CONFIG keys
    for this call only (variant sweeps).

    Shapes decide everything (the plan, cached per key), so a call is one or two launches, needs no host sync and
    captures into a CUDA graph. From a plan's second call on, its launches use the compiled kernels' handles with
    plain addresses (descriptors built in the kernel, or cached ones inside a graph capture; DESC), raw on the
    current stream outside a capture (_RawLaunch): at B=1 the GPU work is ~14 us, so host time per call is the
    eager cost.
    """
    capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
    addresses = (q.data_ptr(), kv_cache.data_ptr(), cache_seqlens.data_ptr())
    plan = _plan_for(q, kv_cache, cache_seqlens, block_table, num_splits, config, capturing, addresses)
    if plan.direct and not capturing and _hooks_idle():
        o_like, lse_like = plan.outputs_like
        o, lse = torch.empty_like(o_like), torch.empty_like(lse_like)
        _direct(plan, addresses, block_table, sm_scale, o, lse)
        return o, lse
    device = plan.device
    o = torch.empty(plan.batch, plan.heads, D_LATENT, dtype=plan.dtype, device=device)
    lse = torch.empty(plan.batch, plan.heads, dtype=torch.float32, device=device)
    if not plan.ready:
        o_part, lse_part = (o, lse) if plan.single else partial_buffers(plan.batch, plan.heads, plan.splits, device,
                                                                        plan.dtype)
        _run(plan, q, kv_cache, cache_seqlens, block_table, sm_scale, o, lse, o_part, lse_part)
        return o, lse
    o_ptr, lse_ptr = o.data_ptr(), lse.data_ptr()
    if plan.single:
        part_ptr, lse_part_ptr = o_ptr, lse_ptr
    else:
        scratch = _scratch(plan, capturing)  # held until the launches are queued
        part_ptr = scratch.data_ptr()
        lse_part_ptr = part_ptr + plan.lse_offset
    _run(plan, *addresses, None if block_table is None else block_table.data_ptr(), sm_scale, o_ptr, lse_ptr,
         part_ptr, lse_part_ptr)
    return o, lse
