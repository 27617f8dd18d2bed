"""Our chunked KDA forward in Triton: one chunk-parallel preparation kernel plus one sequential state scan.

Math: KERNELS.md section 1.3. Per 64-token chunk with chunk-local log2 cumulative decay G (Gamma = 2^G):
    L  = strictly-lower beta_r k_r.(2^(G_r - G_j) k_j)        Aqk = lower-incl. scale q_r.(2^(G_r - G_j) k_j)
    M  = (I + L)^-1                                           W = M (beta Gamma K),  U = M (beta V)
    kg = 2^(G_C - G) K,  qg = scale Gamma Q,  gc = 2^(G_C)
and the scan, per chunk with entry state S (fp32, in registers):
    V' = U - W S;   O = qg S + Aqk V';   S <- diag(gc) S + kg^T V'.

Exponent range (KERNELS.md section 1.4): exp2(G_r - G_j) is split into a row and a column factor around an
anchor that is always a past row of the rows it serves, with a fixed (zero) offset: the row just before the
16-row sub-chunk for the diagonal tiles and the first sub-diagonal, and the row before sub-chunk 2 for the
three tiles further down (see _kda_prep). With g in [-5, 0) every factor stays below 2^115.4, finite in fp32
and tf32, and a factor can underflow only where the exact product is below 2^-126; o_t never depends on later
tokens. Partial chunks are padded with g = k = v = beta = 0, so padded rows neither decay the state nor add to
it.

The preparation kernel builds Akk and Aqk with three 64x64 tf32 dots each (one per band of tiles), inverts
the four 16x16 diagonal blocks of I + L by forward substitution in fp32 and merges them with three more
dots. It writes W, U, kg, qg, Aqk and gc once (in the inputs' dtype, gc in fp32); the scan reads them once
per V-block and writes o and the final state, so no per-chunk state goes to memory. Two launches in all,
against FLA's six.
"""

import torch
import triton
import triton.language as tl

BT = 64  # chunk length

# The last compiled kernels launched, by name, so benchmarks can report registers, spills and shared memory.
LAUNCHED = {}
# BV: V columns per scan program (None picks by B*H so that about 128 programs run); BK / BVP: K and V
# columns per step of the preparation kernel's loops. H200 sweep of 2026-11-29 (benchmarks/RESULTS.md): scan
# num_stages 3 beat 2 on every shape (3-8%); BK 32, 8 prep warps, 8 scan warps and BV 32 were all slower.
CONFIG = {"BV": None, "scan_warps": 4, "scan_stages": 3, "BK": 64, "BVP": 64, "prep_warps": 4,
          "prep_stages": 1}


@triton.jit
def _load_chunk(base, t0, T, stride, cols):
    """Rows t0..t0+63 of a [T, stride] view at `cols` as a [4, 16, len(cols)] fp32 tile (sub-chunk, row, col),
    zero past T: this zero padding is what makes partial chunks exact."""
    rows = t0 + tl.arange(0, 4)[:, None, None] * 16 + tl.arange(0, 16)[None, :, None]
    ptrs = base + rows.to(tl.int64) * stride + cols[None, None, :]
    return tl.load(ptrs, mask=rows < T, other=0.0).to(tl.float32)


@triton.jit
def _store_chunk(base, stride, cols, x):
    rows = tl.arange(0, 64)
    tl.store(base + rows[:, None].to(tl.int64) * stride + cols[None, :], x.to(base.dtype.element_ty))


@triton.jit
def _flat(x, BK: tl.constexpr):
    return tl.reshape(x, [64, BK])


@triton.jit
def _pick(x, i):
    """Row i of a [4, N] tensor, as [N]."""
    return tl.sum(tl.where(tl.arange(0, 4)[:, None] == i, x, 0.0), 0)


@triton.jit
def _inv_blocks(Ld):
    """(I + L_b)^-1 for each strictly lower 16x16 block L_b of Ld [4, 16, 16], by forward substitution in fp32."""
    r = tl.arange(0, 16)
    R = r[None, :, None]
    X = tl.where(R == r[None, None, :], 1.0, 0.0) + tl.zeros([4, 16, 16], dtype=tl.float32)
    for i in tl.static_range(1, 16):
        li = tl.sum(tl.where(R == i, Ld, 0.0), 1)
        upd = tl.sum(li[:, :, None] * X, 1)
        X = tl.where(R == i, X - upd[:, None, :], X)
    return X


@triton.jit(do_not_specialize=["T", "NT", "H"])
def _kda_prep(q, k, v, g, beta, w, u, qg, kg, aqk, gc, T, NT, scale, H,
              K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BVP: tl.constexpr):
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    t0 = i_t * 64
    LN2INV: tl.constexpr = 1.4426950408889634
    # inputs are [B, T, H, D]: token t of (b, h) sits at row (b*T + t)*H + h
    in_row = (i_b.to(tl.int64) * T) * H + i_h
    qb = q + in_row * K
    kb = k + in_row * K
    gb = g + in_row * K
    vb = v + in_row * V
    # intermediates are [B*H, NT*64, D], chunk-contiguous for the scan
    mid_row = (i_bh.to(tl.int64) * NT + i_t) * 64
    gcb = gc + (i_bh.to(tl.int64) * NT + i_t) * K

    r64 = tl.arange(0, 64)
    bt = tl.load(beta + in_row + (t0 + r64) * H, mask=t0 + r64 < T, other=0.0).to(tl.float32)
    blk = tl.arange(0, 4)[:, None]
    rr = r64[:, None]
    cc = r64[None, :]
    band = rr // 16 - cc // 16

    akk = tl.zeros([64, 64], dtype=tl.float32)
    aqk_acc = tl.zeros([64, 64], dtype=tl.float32)
    # Pass 1 over K. With Gw the cumulative log2 decay inside each 16-row sub-chunk, s its sub-chunk totals
    # and c_i = G at the row before sub-chunk i, exp2(G_r - G_j) is factored per band of 16x16 tiles so that
    # no factor leaves the fp32 range and every anchor is a past row of the rows it serves:
    #   diagonal tiles (anchor c_i):       rows 2^Gw_r,                  cols 2^-Gw_j          (<= 2^115.4)
    #   first sub-diagonal (c_i = c_j+1):  rows 2^Gw_r,                  cols 2^(s_j - Gw_j)   (<= 1)
    #   tiles i >= j + 2 (anchor c_2):     rows 2^(Gw_r + c_i - c_2),    cols 2^(c_2 - G_j)    (<= 1)
    # Factors <= 1 may underflow only where the exact product is below 2^-126.
    for kk in tl.static_range(0, K, BK):
        cols = kk + tl.arange(0, BK)
        g3 = _load_chunk(gb, t0, T, H * K, cols) * LN2INV
        gw3 = tl.cumsum(g3, 1)
        s = tl.sum(g3, 1)
        cs = tl.cumsum(s, 0) - s
        cC = tl.sum(s, 0)
        c2 = _pick(cs, 2)
        k3 = _load_chunk(kb, t0, T, H * K, cols)
        q3 = _load_chunk(qb, t0, T, H * K, cols)

        ew = tl.exp2(gw3)
        row_k = k3 * ew
        row_q = q3 * ew
        col0 = k3 / ew
        col1 = col0 * tl.exp2(s)[:, None, :]
        f2r = tl.where(blk >= 2, tl.exp2(tl.minimum(cs - c2[None, :], 0.0)), 0.0)[:, None, :]
        f2c = tl.where(blk <= 1, tl.exp2(tl.minimum(c2[None, :] - cs - s, 0.0)), 0.0)[:, None, :]

        _store_chunk(qg + mid_row * K, K, cols, _flat(row_q * tl.exp2(cs)[:, None, :] * scale, BK))
        _store_chunk(kg + mid_row * K, K, cols, _flat(k3 * tl.exp2(cC[None, None, :] - gw3 - cs[:, None, :]), BK))
        tl.store(gcb + cols, tl.exp2(cC))

        rk = _flat(row_k, BK)
        rq = _flat(row_q, BK)
        c0t = tl.trans(_flat(col0, BK))
        c1t = tl.trans(_flat(col1, BK))
        c2t = tl.trans(_flat(col1 * f2c, BK))
        rk2 = _flat(row_k * f2r, BK)
        rq2 = _flat(row_q * f2r, BK)
        akk += tl.where((band == 0) & (rr > cc), tl.dot(rk, c0t), 0.0)
        akk += tl.where(band == 1, tl.dot(rk, c1t), 0.0)
        akk += tl.where(band >= 2, tl.dot(rk2, c2t), 0.0)
        aqk_acc += tl.where((band == 0) & (rr >= cc), tl.dot(rq, c0t), 0.0)
        aqk_acc += tl.where(band == 1, tl.dot(rq, c1t), 0.0)
        aqk_acc += tl.where(band >= 2, tl.dot(rq2, c2t), 0.0)

    _store_chunk(aqk + mid_row * 64, 64, r64, aqk_acc * scale)

    # M = (I + L)^-1 with L = diag(beta) Akk: invert the four diagonal 16x16 blocks D, then, with
    # Z = D^-1 N for the strictly block-lower rest N (Z^4 = 0), M = D^-1 - Z (D^-1 - Z (D^-1 - Z D^-1)).
    L = akk * bt[:, None]
    L4 = tl.reshape(L, [4, 16, 4, 16])
    b4 = tl.arange(0, 4)
    same = b4[:, None, None, None] == b4[None, None, :, None]
    dinv3 = _inv_blocks(tl.sum(tl.where(same, L4, 0.0), 2))
    dinv = tl.reshape(tl.where(same, dinv3[:, :, None, :], 0.0), [64, 64])
    z = tl.dot(dinv, tl.where(band >= 1, L, 0.0))
    p = tl.dot(z, dinv)
    p = tl.dot(z, dinv - p)
    p = tl.dot(z, dinv - p)
    m = dinv - p

    # pass 2 over K: W = M (beta Gamma K)
    for kk in tl.static_range(0, K, BK):
        cols = kk + tl.arange(0, BK)
        g3 = _load_chunk(gb, t0, T, H * K, cols) * LN2INV
        s = tl.sum(g3, 1)
        G = tl.cumsum(g3, 1) + (tl.cumsum(s, 0) - s)[:, None, :]
        x = _flat(_load_chunk(kb, t0, T, H * K, cols) * tl.exp2(G), BK) * bt[:, None]
        _store_chunk(w + mid_row * K, K, cols, tl.dot(m, x))

    # pass 3 over V: U = M (beta V)
    for vv in tl.static_range(0, V, BVP):
        cols = vv + tl.arange(0, BVP)
        y = _flat(_load_chunk(vb, t0, T, H * V, cols), BVP) * bt[:, None]
        _store_chunk(u + mid_row * V, V, cols, tl.dot(m, y))


@triton.jit(do_not_specialize=["T", "NT", "H"])
def _kda_scan(w, u, qg, kg, aqk, gc, h0, o, ht, T, NT, H,
              K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    ck = tl.arange(0, K)
    cv = i_v * BV + tl.arange(0, BV)
    rt = tl.arange(0, 64)
    state_off = i_bh.to(tl.int64) * K * V + ck[:, None] * V + cv[None, :]
    if HAS_H0:
        S = tl.load(h0 + state_off).to(tl.float32)
    else:
        S = tl.zeros([K, BV], dtype=tl.float32)
    o_base = o + ((i_b.to(tl.int64) * T) * H + i_h) * V
    mid = i_bh.to(tl.int64) * NT * 64
    for it in range(0, NT):
        r = mid + it * 64 + rt
        Wt = tl.load(w + r[:, None] * K + ck[None, :])
        Qt = tl.load(qg + r[:, None] * K + ck[None, :])
        Kt = tl.load(kg + r[:, None] * K + ck[None, :])
        Ut = tl.load(u + r[:, None] * V + cv[None, :]).to(tl.float32)
        At = tl.load(aqk + r[:, None] * 64 + rt[None, :])
        gct = tl.load(gc + (i_bh.to(tl.int64) * NT + it) * K + ck)
        Sb = S.to(Wt.dtype)
        Vp = Ut - tl.dot(Wt, Sb)
        Vb = Vp.to(Wt.dtype)
        Ot = tl.dot(At, Vb, tl.dot(Qt, Sb))
        tok = it * 64 + rt
        tl.store(o_base + tok[:, None] * (H * V) + cv[None, :], Ot.to(o.dtype.element_ty),
                 mask=(tok < T)[:, None])
        S = tl.dot(tl.trans(Kt), Vb, S * gct[:, None])
    tl.store(ht + state_off, S)


def _pick_bv(B, H, V):
    """Widest V-block that still gives about 128 scan programs (the scan is the serial part)."""
    bv = 64
    while bv > 16 and B * H * (V // bv) < 120:
        bv //= 2
    return min(bv, V)


def kda_chunked(q, k, v, g, beta, scale, initial_state, *, BV=None, scan_warps=None, scan_stages=None,
                BK=None, BVP=None, prep_warps=None, prep_stages=None):
    """Chunked KDA forward with explicit launch parameters (None takes CONFIG's value)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if K < 16 or V < 16 or K & (K - 1) or V & (V - 1):
        raise ValueError(f"kda_chunked needs K and V powers of two >= 16, got K={K}, V={V}")
    cfg = dict(CONFIG)
    for name, val in (("BV", BV), ("scan_warps", scan_warps), ("scan_stages", scan_stages), ("BK", BK),
                      ("BVP", BVP), ("prep_warps", prep_warps), ("prep_stages", prep_stages)):
        if val is not None:
            cfg[name] = val
    bv = min(cfg["BV"] or _pick_bv(B, H, V), V)
    bk = min(cfg["BK"], K)
    bvp = min(cfg["BVP"], V)
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    dev = q.device
    NT = triton.cdiv(T, BT)
    # intermediates: chunk-padded, head-major, in the inputs' dtype (fp32 under the CPU interpreter)
    w = torch.empty(B * H, NT * BT, K, dtype=q.dtype, device=dev)
    qg = torch.empty_like(w)
    kg = torch.empty_like(w)
    u = torch.empty(B * H, NT * BT, V, dtype=q.dtype, device=dev)
    aqk = torch.empty(B * H, NT * BT, BT, dtype=q.dtype, device=dev)
    gc = torch.empty(B * H, NT, K, dtype=torch.float32, device=dev)
    o = torch.empty(B, T, H, V, dtype=v.dtype, device=dev)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=dev)
    LAUNCHED["prep"] = _kda_prep[(NT, B * H)](
        q, k, v, g, beta, w, u, qg, kg, aqk, gc, T, NT, float(scale), H, K=K, V=V, BK=bk, BVP=bvp,
        num_warps=cfg["prep_warps"], num_stages=cfg["prep_stages"])
    h0 = initial_state.contiguous() if initial_state is not None else ht
    LAUNCHED["scan"] = _kda_scan[(V // bv, B * H)](
        w, u, qg, kg, aqk, gc, h0, o, ht, T, NT, H, K=K, V=V, BV=bv, HAS_H0=initial_state is not None,
        num_warps=cfg["scan_warps"], num_stages=cfg["scan_stages"])
    return o, ht


def forward(q, k, v, g, beta, scale, initial_state):
    """KDA forward: returns (o [B,T,H,V] in v's dtype, final_state [B,H,K,V] fp32). Needs g in [-5, 0]."""
    return kda_chunked(q, k, v, g, beta, scale, initial_state)
