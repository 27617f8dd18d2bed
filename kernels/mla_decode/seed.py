"""Starting point for MLA decode: one Triton program per (batch, head), an online softmax over the cache."""

import torch
import triton
import triton.language as tl

TUNABLES = {"BLOCK_N": [16, 32, 64], "num_warps": [2, 4, 8]}
CONFIG = {"BLOCK_N": 16, "num_warps": 4}

D_LATENT = 512
D_ROPE = 64
LOG2E = 1.4426950408889634


@triton.jit
def _mla_decode_one_head(
    Q, KV, SEQLENS, O, LSE, BT,
    qk_scale,
    stride_qb, stride_qh, stride_kvb, stride_kvn, stride_ob, stride_oh, stride_btb,
    H, PAGE_SIZE,
    D_LAT: tl.constexpr, D_ROPE: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr,
):
    """Scores by broadcast-multiply-and-sum (no tensor cores), so every head re-reads the whole cache.

    PAGED: row n of batch row b is row n % PAGE_SIZE of page BT[b, n // PAGE_SIZE] (stride_kvb is then the page
    stride); otherwise it is row n of b's own [N, 576] slab."""
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    seqlen = tl.load(SEQLENS + b)
    offs_c = tl.arange(0, D_LAT)
    offs_r = tl.arange(0, D_ROPE)
    q_ptr = Q + b * stride_qb + h * stride_qh
    # Scores live in log2 units: exp2 is the cheap hardware exponential, and the scale is applied once to q.
    q_lat = tl.load(q_ptr + offs_c).to(tl.float32) * qk_scale
    q_rope = tl.load(q_ptr + D_LAT + offs_r).to(tl.float32) * qk_scale

    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([D_LAT], dtype=tl.float32)
    for n0 in range(0, seqlen, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < seqlen
        if PAGED:
            page = tl.load(BT + b * stride_btb + offs_n // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
            row_ptr = KV + page[:, None] * stride_kvb + (offs_n % PAGE_SIZE)[:, None] * stride_kvn
        else:
            row_ptr = KV + b * stride_kvb + offs_n[:, None] * stride_kvn
        c = tl.load(row_ptr + offs_c[None, :], mask=mask_n[:, None], other=0.0)
        r = tl.load(row_ptr + D_LAT + offs_r[None, :], mask=mask_n[:, None], other=0.0)
        c = c.to(tl.float32)
        s = tl.sum(c * q_lat[None, :], axis=1) + tl.sum(r.to(tl.float32) * q_rope[None, :], axis=1)
        s = tl.where(mask_n, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * c, axis=0)
        m_i = m_new

    o_ptr = O + b * stride_ob + h * stride_oh
    tl.store(o_ptr + offs_c, (acc / l_i).to(O.dtype.element_ty))
    # Back to natural log for the caller: lse = ln(sum exp(s)) = ln(2) * (m2 + log2(l)).
    tl.store(LSE + pid, (m_i + tl.log2(l_i)) * 0.6931471805599453)


def forward(q, kv_cache, cache_seqlens, sm_scale, block_table=None):
    """o [B,H,512] in q's dtype and lse [B,H] fp32 for one decode step; cache rows >= cache_seqlens are ignored.

    kv_cache is [B, N, 576], or with block_table [B, pages] int32 a paged cache [pages, page_size, 576]."""
    batch, heads, _ = q.shape
    o = torch.empty(batch, heads, D_LATENT, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, heads, dtype=torch.float32, device=q.device)
    paged = block_table is not None
    _mla_decode_one_head[(batch * heads,)](
        q, kv_cache, cache_seqlens, o, lse, block_table,
        float(sm_scale) * LOG2E,
        q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), o.stride(0), o.stride(1),
        block_table.stride(0) if paged else 0,
        heads, kv_cache.shape[1],
        D_LAT=D_LATENT, D_ROPE=D_ROPE, BLOCK_N=CONFIG["BLOCK_N"], PAGED=paged, num_warps=CONFIG["num_warps"],
    )
    return o, lse
