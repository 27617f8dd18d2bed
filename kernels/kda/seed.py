"""Seed KDA kernel: the token-by-token recurrence in Triton, one program per (batch*head, V-block).

Simple and correct rather than fast: the fp32 state tile [K, BV] stays in registers and every token is one
step of S = diag(exp g) S; S += beta k (v - S^T k)^T; o = S^T (scale q). It does no chunking, so the work is
serial in T; a session improves it from here (KERNELS.md sections 1.3 and 4.1 describe the chunked form).
"""

import torch
import triton
import triton.language as tl

TUNABLES = {"BV": [16, 32, 64, 128], "num_warps": [1, 2, 4, 8]}
CONFIG = {"BV": 32, "num_warps": 4}


@triton.jit
def _kda_recurrent(q, k, v, g, beta, h0, o, ht, T, scale,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    ck = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    mk = ck < K
    mv = cv < V
    mkv = mk[:, None] & mv[None, :]
    state_off = i_bh.to(tl.int64) * K * V + ck[:, None] * V + cv[None, :]
    if HAS_H0:
        S = tl.load(h0 + state_off, mask=mkv, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BK, BV], dtype=tl.float32)
    tok = (i_b.to(tl.int64) * T) * H + i_h  # (b, t=0, h) in units of rows of [B, T, H, *]
    for t in range(0, T):
        row = tok + t * H
        qt = tl.load(q + row * K + ck, mask=mk, other=0.0).to(tl.float32) * scale
        kt = tl.load(k + row * K + ck, mask=mk, other=0.0).to(tl.float32)
        gt = tl.load(g + row * K + ck, mask=mk, other=0.0).to(tl.float32)
        vt = tl.load(v + row * V + cv, mask=mv, other=0.0).to(tl.float32)
        bt = tl.load(beta + row).to(tl.float32)
        S = S * tl.exp(gt)[:, None]
        err = vt - tl.sum(kt[:, None] * S, axis=0)
        S = S + (bt * kt)[:, None] * err[None, :]
        ot = tl.sum(qt[:, None] * S, axis=0)
        tl.store(o + row * V + cv, ot.to(o.dtype.element_ty), mask=mv)
    tl.store(ht + state_off, S, mask=mkv)


def forward(q, k, v, g, beta, scale, initial_state):
    """KDA forward: returns (o [B,T,H,V] in v's dtype, final_state [B,H,K,V] fp32)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    o = torch.empty(B, T, H, V, dtype=v.dtype, device=v.device)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=v.device)
    h0 = initial_state.contiguous() if initial_state is not None else ht
    BV = min(CONFIG["BV"], triton.next_power_of_2(V))
    grid = (triton.cdiv(V, BV), B * H)
    _kda_recurrent[grid](q, k, v, g, beta, h0, o, ht, T, float(scale), H=H, K=K, V=V,
                         BK=triton.next_power_of_2(K), BV=BV, HAS_H0=initial_state is not None,
                         num_warps=CONFIG["num_warps"])
    return o, ht
