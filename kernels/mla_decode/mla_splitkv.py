"""Our split-KV MLA decode: stage 1 reads each latent tile once for QK and PV over all heads, stage 2 merges splits."""

import functools

import torch
import triton
import triton.language as tl

TUNABLES = {"BLOCK_N": [16, 32, 64], "num_stages": [2, 3, 4, 6, 8], "num_splits": [0, 16, 32, 64, 128],
            "LAZY_RESCALE": [False, True]}
# num_splits 0 means: choose from the shape so that stage 1 has about one program per SM.
# Measured on the H200 (benchmarks/mla_bench.py --tune, 2026-11-29): BLOCK_N=64 x 2 stages is fastest at M3
# (163 us) and ties at M1 (17.3 us); 32 x 3/4 stages 170/171 us, 16 x 6/8 stages 278 us, and LAZY_RESCALE is 4-7%
# slower (it spills a little at 255 registers). Deeper pipelining buys nothing, so the per-tile math (72 small
# 64x16x16 or 64x32x16 wgmmas for QK, each re-reading q from shared memory) is the limit, not load latency.
CONFIG = {"BLOCK_N": 64, "num_stages": 2, "num_splits": 0, "LAZY_RESCALE": False}

D_LATENT = 512
D_ROPE = 64
BLOCK_H = 64
"""Heads per stage-1 program: one wgmma M, and the 64x512 fp32 accumulator (128 KB) fits 8 warps' registers."""
STAGE1_WARPS = 8
LOG2E = 1.4426950408889634


@triton.jit
def _mla_split_attend(
    Q, KV, SEQLENS, O, LSE, OP, LSEP,
    qk_scale, split_len,
    stride_qb, stride_qh, stride_kvb, stride_kvn, stride_ob, stride_oh,
    H, num_splits,
    D_LAT: tl.constexpr, D_ROPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    SINGLE: tl.constexpr, LAZY_RESCALE: tl.constexpr,
):
    """One (head group, split, batch row): online softmax over rows [s*split_len, min((s+1)*split_len, len)).

    With SINGLE the split is the whole row and the program writes the final o and lse; otherwise it writes o
    normalised by its own denominator (in OP's dtype) and lse in log2 units to the partial buffers, and writes
    nothing at all when the split is empty (stage 2 skips it by the same bounds).
    """
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
    # q stays a plain load so the compiler can park it in shared memory as the wgmma A operand; the scale is
    # applied to the fp32 scores instead (one multiply per score, and no second bf16 rounding of q).
    q_lat = tl.load(q_ptr + offs_c[None, :], mask=mask_h[:, None], other=0.0)
    q_rope = tl.load(q_ptr + D_LAT + offs_r[None, :], mask=mask_h[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D_LAT], dtype=tl.float32)
    kv_ptr = KV + b * stride_kvb
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        row_ptr = kv_ptr + offs_n[:, None] * stride_kvn
        # The latent tile is loaded once: transposed it is the key's latent part, as is it is the value.
        c = tl.load(row_ptr + offs_c[None, :], mask=mask_n[:, None], other=0.0)
        r = tl.load(row_ptr + D_LAT + offs_r[None, :], mask=mask_n[:, None], other=0.0)
        s = tl.dot(q_lat, tl.trans(c))
        s = tl.dot(q_rope, tl.trans(r), s)
        # Log2 units from here on, in both stages: exp2 is the hardware exponential.
        s = tl.where(mask_n[None, :], s * qk_scale, -float("inf"))
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
    H, num_splits,
    D_LAT: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One (batch, head, BLOCK_D columns): weights exp2(lse_s - max) over the non-empty splits only."""
    pid_bh = tl.program_id(0)
    pid_d = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    seqlen = tl.load(SEQLENS + b)
    offs_s = tl.arange(0, BLOCK_S)
    # Same bounds as stage 1: split s holds rows from s*split_len, so it is empty when that is past the length.
    valid = (offs_s < num_splits) & (offs_s * split_len < seqlen)
    lse = tl.load(LSEP + pid_bh * num_splits + offs_s, mask=valid, other=-float("inf"))
    m = tl.max(lse, axis=0)
    # Split 0 is never empty (len >= 1), but a -inf max would turn every weight into exp2(-inf + inf) = NaN.
    m = tl.where(m == -float("inf"), 0.0, m)
    w = tl.where(valid, tl.exp2(lse - m), 0.0)
    denom = tl.sum(w, axis=0)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    part = tl.load(OP + (pid_bh * num_splits + offs_s)[:, None] * D_LAT + offs_d[None, :], mask=valid[:, None],
                   other=0.0).to(tl.float32)
    out = tl.sum(part * w[:, None], axis=0) / denom
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty))
    if pid_d == 0:
        tl.store(LSE + pid_bh, (m + tl.log2(denom)) * 0.6931471805599453)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    """Multiprocessors to fill; the CPU interpreter has none, so use a small number there."""
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_plan(batch: int, heads: int, n: int, device: torch.device, num_splits: int = 0,
               block_n: int = 0) -> tuple[int, int]:
    """(splits, rows per split) from shapes alone, so the wrapper never waits on the GPU.

    Splits are sized to whole BLOCK_N tiles, and the count is recomputed from that size, so no split past the
    last is ever launched; shorter rows leave their later splits empty, which both stages detect by start >= len.
    """
    block_n = block_n or CONFIG["BLOCK_N"]
    if num_splits <= 0:
        num_splits = CONFIG["num_splits"]
    if num_splits <= 0:
        groups = batch * triton.cdiv(heads, BLOCK_H)
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


def attend_into(q, kv_cache, cache_seqlens, sm_scale, o, lse, o_part, lse_part, splits: int, split_len: int):
    """Launch stage 1 (and stage 2 when splits > 1) into caller-owned buffers.

    Separate from forward so tests can hand in NaN-filled scratch and prove that empty splits are never read.
    """
    batch, heads, _ = q.shape
    single = splits == 1
    if single:
        o_part, lse_part = o, lse
    grid = (triton.cdiv(heads, BLOCK_H), splits, batch)
    _mla_split_attend[grid](
        q, kv_cache, cache_seqlens, o, lse, o_part, lse_part,
        float(sm_scale) * LOG2E, split_len,
        q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), o.stride(0), o.stride(1),
        heads, splits,
        D_LAT=D_LATENT, D_ROPE=D_ROPE, BLOCK_H=BLOCK_H, BLOCK_N=CONFIG["BLOCK_N"], SINGLE=single,
        LAZY_RESCALE=CONFIG["LAZY_RESCALE"],
        num_warps=STAGE1_WARPS, num_stages=CONFIG["num_stages"],
    )
    if not single:
        block_s = triton.next_power_of_2(splits)
        # Keep the [splits, BLOCK_D] partial tile at 8K floats: 64 registers a thread at 4 warps.
        block_d = max(32, min(D_LATENT, 8192 // block_s))
        _mla_merge_splits[(batch * heads, D_LATENT // block_d)](
            o_part, lse_part, cache_seqlens, o, lse,
            split_len, o.stride(0), o.stride(1), heads, splits,
            D_LAT=D_LATENT, BLOCK_S=block_s, BLOCK_D=block_d, num_warps=4,
        )


def forward(q, kv_cache, cache_seqlens, sm_scale, num_splits: int = 0):
    """o [B,H,512] in q's dtype and lse [B,H] fp32; num_splits > 0 forces the split count (tests, sweeps).

    Thin on purpose: shapes decide everything, so a call is two launches (one when a single split covers N),
    needs no host sync and captures into a CUDA graph.
    """
    batch, heads, _ = q.shape
    splits, split_len = split_plan(batch, heads, kv_cache.shape[1], q.device, num_splits, CONFIG["BLOCK_N"])
    o = torch.empty(batch, heads, D_LATENT, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, heads, dtype=torch.float32, device=q.device)
    o_part, lse_part = (o, lse) if splits == 1 else partial_buffers(batch, heads, splits, q.device, q.dtype)
    attend_into(q, kv_cache, cache_seqlens, sm_scale, o, lse, o_part, lse_part, splits, split_len)
    return o, lse
