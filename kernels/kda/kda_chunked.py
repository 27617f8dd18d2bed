"""Our chunked KDA forward in Triton: one chunk-parallel preparation kernel plus one sequential state scan.

Math: KERNELS.md section 1.3. Per 64-token chunk with chunk-local log2 cumulative decay G (Gamma = 2^G):
    L  = strictly-lower beta_r k_r.(2^(G_r - G_j) k_j)        Aqk = lower-incl. scale q_r.(2^(G_r - G_j) k_j)
    M  = (I + L)^-1 diag(beta)                                W = M (Gamma K),  U = M V
    kg = 2^(G_C - G) K,  qg = scale Gamma Q,  gc = 2^(G_C)
and the scan, per chunk with entry state S (fp32, in registers):
    V' = U - W S = M (V - (Gamma K) S);   O = qg S + Aqk V';   S <- diag(gc) S + kg^T V'.
The second form of V' (m_scan 2) lets the prep store M and Gamma K and never form W or U, so that it reads no V
and writes no U, while the scan applies M to V - (Gamma K) S, one 64x64xBV product more on its chain.

Exponent range (KERNELS.md section 1.4): exp2(G_r - G_j) is split into a row and a column factor around an
anchor that is always a past row of the rows it serves. First around the chunk start (anchor 0): row factors
2^G_r <= 1 and column factors 2^-G_j, one tensor-core product per K slice for all of Akk and one (or three) for
Aqk. That is exact and finite for each row whose decay from the chunk start stays below REACH = 120 log2 units on
every channel, which holds for every row of the task's default and mild gates. Rows at or past it (at the g = -5
bound, rows 16 on) are then redone around the row before their 16-row block, as before: row factors <= 1, column
factors <= 2^115.4 for g in [-5, 0). Each row's own decay picks its path, so o_t never depends on later tokens.
Partial chunks are padded with g = k = v = beta = 0, so padded rows neither decay the state nor add to it.

Precision: o is compared in bf16 with the fp64 oracle's bf16 o, and a CPU model of this arithmetic
(benchmarks/kda_precision.py) put most of the remaining error on the bf16 operands of Aqk and on beta V's
rounding. Aqk is therefore one tf32 product of fp32 operands (aqk_ops, _aqk_dot), and beta is folded into M's
columns, so U = (M diag beta) V rounds M beta once and V not at all.

Preparation, _kda_prep, one program per (chunk, head): one pass over K in BK-column slices (cumsum, the chunk-start
products accumulated in place) stores qg, kg, gc, Aqk and Gamma K (into w) and keeps L in registers, with a
second pass only where rows reach REACH; then the four 16x16 diagonal blocks of I + L, passed through a scratch
slot of the chunk so that they are read back transposed and block-index last (no dependent step needs a layout
change or crosses a warp), are inverted in fp32 (forward substitution on their 8x8 halves, all eight at once, and
two 8x8x8 products for each corner) and merged with four tf32 products into M diag(beta); then
(m_scan 0) W = M diag(beta) Gamma K overwrites the parked values while U = M diag(beta) V is written, both in
64-column slices, or (m_scan 1, 2) M itself is stored for the scan. With 32-column K slices and a 168-register
cap, three programs share an SM. The scan (_kda_scan) reads the intermediates once per V-block and writes o and
the final state, so no per-chunk state goes to memory. Two launches in all, against FLA's six. Three layout knobs
(far_split, prep_split, prep_order; CONFIG) rearrange the preparation into more launches or another grid order
without changing a rounding.
"""

import torch
import triton
import triton.language as tl

BT = 64  # chunk length
REACH = tl.constexpr(120.0)
"""log2 decay from the chunk start up to which a row's products are taken around the chunk start (2^120 and
2^-120 are normal in fp32 and bf16, with 2^6 to spare before overflow)."""
INV_SLOT = tl.constexpr(1536)
"""fp32 per chunk of inv_mem's scratch: the four diagonal 16x16 blocks (later D^-1's), then eight 8x8 inverses."""

# The last compiled kernels launched, by name, so benchmarks can report registers, spills and shared memory.
LAUNCHED = {}
# BV: V columns per scan program (None picks by B*H so that about 128 programs run); BK / BVP: K and V columns
# per step of the prep; prep_stages: software pipelining of the prep's K loop. Measured as H200 K1 totals in ms,
# FLA 0.6.0 in the same run (benchmarks/RESULTS.md has the tables).
# 2026-12-07 (session 36), an H100 (no H200 came), FLA 2.162: CONFIG with inv_mem 1 (the diagonal blocks, their
#   halves' inverses and D^-1 through a scratch slot) 0.970 (prep 0.685, scan 0.275) against 1.058 (prep 0.773)
#   for inv_mem 0; faster on every shape, 5-9% (K1lb 1.844 against 1.947); prep_split with it 1.062 (K1lb
#   1.924). Same o error (held-out at most 3.79e-3). Removed unmeasured: only the blocks through the slot, the
#   inverse in registers (4,592 SASS instructions against 4,352), and that with D^-1 read back (4,616).
# 2026-12-07 (session 35), an H100 (no H200 came), FLA 2.193: CONFIG 1.048 (prep 0.764, scan 0.280); M applied in
#   the scan, m_scan 2 at two scan stages, 1.043 (prep 0.667, scan 0.371): K1-K3, K5 within 1%, K1lb 1.914 against
#   1.956, but K4 +5%, K6 +21%, K7 +19%, so CONFIG keeps 0. Removed, slower on every shape: the scan with the state
#   transposed (scan_t; 1.178, with m_scan 2 1.104, with m_scan 1 1.069) and M packed into Aqk's upper triangle
#   (m_scan 4, three stages: 1.149). Held-out o at most 3.79e-3 (m_scan 1: 3.51e-3).
# 2026-12-02 (session 33), FLA 1.841: the second (16-row anchor) path redone as one runtime loop over blocks 1-3,
#   each slice the same single-block body and unpipelined (far_stages 1): 168 registers, 16 B of stack (88 before),
#   K1 0.995, prep 0.767 (K5 0.998), against the session-32 kernel's 1.030 / 0.804 in the same run; K1lb 1.850
#   against 1.572 (the cumsum of g is now taken once a block, three times a slice, on that path); far_split 0.988
#   (K1lb 2.816); prep_stages 2 1.012; scan_warps 8 1.141. Held-out o at most 3.80e-3 for all. On a second
#   machine (FLA 1.849): this CONFIG 1.003; one cumsum and one load of g, k, q per slice with a runtime loop over
#   the blocks inside it 1.010 (K1lb 1.720 against 1.867); far_stages 3 1.009; prep_stages 4 1.069.
# 2026-12-02 (session 32), FLA 1.846: this CONFIG (BK 32, prep_nreg 168: 168 registers, 88 B of stack, 56 KB of
#   shared memory, so three programs an SM instead of two) 1.036, prep 0.810 ms (held-out o at most 3.80e-3;
#   K1lb 1.571); the same with far_split 0.997 (prep 0.770, no spills) but K1lb 2.518 (0.73x FLA), so far_split
#   stays out; BK 32 uncapped 1.081; BK 32 + aqk_ops 1 + cap 1.048 (3.76e-3); the 64-column CONFIG of before
#   1.088. BK 32 needed W = M (Gamma K) in 64-column slices (BW): with W in BK-column slices, as before, every BK
#   32 variant (capped or not, far_split 0, 1 or 2, prep_stages 1 or 3) hit an illegal address or gave o error
#   up to 0.17 (Triton 3.6; the interpreter is right either way), so BVP stays 64 too.
# 2026-12-01 (issue 19), FLA 1.842: the 64-column CONFIG 1.081 (o error 3.4e-3 at K1, held-out at most
#   3.80e-3); the 2026-11-30 kernel 1.216 (4.38e-3); prep_stages 2 1.151; Aqk from one bf16 product (aqk_ops 0)
#   1.034 but held-out o 4.11e-3, three bf16 products (aqk_ops 1) 1.188 (3.76e-3). BK 32 with BVP 32 faulted (see
#   above). aqk_lo with scan_stages 3 needs 237568 B of shared memory, over the 232448 limit.
# 2026-11-30, FLA 1.842: anchors in one reduction + inverse by 8x8 halves: 1.221; each alone 1.228 / 1.242;
#   neither (four row reductions and a 15-step 16x16 substitution): 1.253
#   removed (same day, against 1.227-1.229 in the same runs): halves inverted by halves again (4x4) 1.229; 8x8
#   halves by fp32 products (I - T)(I + T^2)(I + T^4) 1.551; v prefetched before the inverse 1.225 (noise), v and
#   the stash 1.234; scan as a programmatic dependent launch 1.232; scan issuing the state update before the
#   output 1.258
#   kept knobs: BV 32: 1.441; scan_warps 8: 1.475
#   removed: untransposed forward substitution: 1.258-1.263, same errors (also in benchmarks/kda_stress.py)
#   removed: row blocks masked after the products 1.283 (1.274 with 2 stages); K loop unrolled 1.300
#   removed: prep register cap 168: 1.416, 128: 1.958 (spills); block-local anchors 1.376
#   removed: anchors from block sums 1.753 (of the tile) / 1.429 (of a second load); cumsum by tf32 products 1.985
#   removed: diagonal inverse by powers of L: NaN in tf32 on identical keys, 1.294 in tf32x3
# 2026-12-01 (session 27), FLA 1.846 / 1.840 in the same runs, K1 do_bench ms (benchmarks/RESULTS.md):
#   CONFIG 1.088 / 1.082; far_split 1.063 / 1.055 (prep 0.83 ms, no spills) but at K1 with every gate at the
#   g = -5 bound (K1lb, every chunk's later rows on the second path) 3.858 against CONFIG's 1.606, so far_split
#   stays 0 and out of the tuner's reach (TUNABLES offers 0 only: the task's shapes have no such gates at scale);
#   far_split + 8 prep warps + prep_nreg 128 1.241 (two programs an SM, 44% more instructions), heads-fastest
#   grid 1.233; prep_split 1.091 (prep 0.42 + _kda_wy 0.44), with 8 warps and the cap 1.203. Same errors.
# Earlier: 8 prep warps doubled the prep time (2026-11-30); scan_stages 3 beat 2 on every shape (2026-11-29).
TUNABLES = {"scan_warps": [2, 4, 8], "scan_stages": [2, 3, 4], "BK": [32, 64], "BVP": [64], "prep_warps": [4, 8],
            "prep_stages": [1, 2, 3], "aqk_ops": [0, 1, 2], "aqk_lo": [0, 1], "far_split": [0],
            "prep_split": [0, 1], "prep_order": [0, 1], "prep_nreg": [0, 128, 168], "wy_warps": [4, 8],
            "far_stages": [1, 2, 3], "m_scan": [0, 1, 2], "inv_mem": [0, 1]}
"""What the offline tuner (and an agent) may vary; BV stays automatic. aqk_ops: Aqk from one bf16 product (0),
from three that split the operands' rounding off (1), or from one tf32 product (2) (_aqk_dot); aqk_lo: Aqk's
rounding remainder stored too, for a second product in the scan. far_split: the prep compiled without the
second (16-row anchor) path, which a second launch runs for the chunks that need it; prep_split: M, W and U in a
kernel of their own (_kda_wy), L passed through memory in fp32; prep_order: the prep's grid heads-fastest (1)
instead of chunks-fastest (0). The three change no rounding (o bit-identical under the interpreter).
prep_nreg: a register cap for the (first) prep launch, 0 for none: 168 fits three programs of 4 warps on an SM
(with BK 32: 16 B of stack, ptxas sm_90); with 8 prep warps and far_split, 128 fits two programs of 8 warps;
wy_warps: warps of _kda_wy; far_stages: software pipelining of the second path's K loop (1: none, which keeps the
common path's registers at 168 with 16 B of stack; 3: 64 B).
m_scan: where M = (I + L)^-1 diag(beta) is applied: 0, the prep forms W and U; 1, the prep forms W and the scan
U = M V; 2, the prep stores M and Gamma K only and the scan forms V' = M (V - (Gamma K) S). At K = V = 128 the scan
of 1 or 2 fits two stages only (three need 240 and 232 KB of shared memory, over the 227 KB limit; ptxas sm_90).
inv_mem: how the four 16x16 diagonal blocks of L are inverted: 0, in registers, by a register transpose and
masked reductions (no scratch memory); 1, through a scratch slot of the chunk (INV_SLOT fp32, 6 KB): the
blocks are stored from L's own registers and read back as the transposed 8x8 halves, block-index last so that the
warps split the blocks and no substitution step crosses a warp, and the halves' inverses and the merged D^-1 go
back through the slot too (1,320 SASS instructions fewer than 0, same registers). Neither changes a rounding."""
CONFIG = {"BV": None, "scan_warps": 4, "scan_stages": 3, "BK": 32, "BVP": 64, "prep_warps": 4,
          "prep_stages": 3, "aqk_ops": 2, "aqk_lo": 0, "far_split": 0, "prep_split": 0, "prep_order": 0,
          "prep_nreg": 168, "wy_warps": 4, "far_stages": 1, "m_scan": 0, "inv_mem": 1}


@triton.jit
def _rows_tile(base, r64, rmask, stride, cols):
    """Rows r64 (chunk-local) of a [64, stride] view at `cols` as fp32 [64, len(cols)], zero past T (the zero
    padding is what makes partial chunks exact). Offsets stay int32: a chunk spans under 2^31 elements."""
    ptrs = base + (r64[:, None] * stride + cols[None, :])
    return tl.load(ptrs, mask=rmask[:, None], other=0.0).to(tl.float32)


@triton.jit
def _store_chunk(base, stride, cols, x):
    rows = tl.arange(0, 64)
    tl.store(base + (rows[:, None] * stride + cols[None, :]), x.to(base.dtype.element_ty))


@triton.jit
def _inv_blocks_t(Lt, NB: tl.constexpr, N: tl.constexpr):
    """(I + L_b)^-1 for each strictly lower NxN block L_b, by forward substitution in fp32, from the transposed
    blocks Lt[b, j, i] = L_b[i, j] [NB, N, N]: row i of L_b is then a sum over the last axis and the update a
    sum over the middle one, and each result broadcasts back along the axis it was reduced over, so the N-1
    dependent steps need no layout conversion (the transpose is done once, before)."""
    r = tl.arange(0, N)
    R = r[None, :, None]
    C = r[None, None, :]
    X = tl.where(R == C, 1.0, 0.0) + tl.zeros([NB, N, N], dtype=tl.float32)
    for i in tl.static_range(1, N):
        li = tl.sum(tl.where(C == i, Lt, 0.0), 2)
        upd = tl.sum(li[:, :, None] * X, 1)
        X = tl.where(R == i, X - upd[:, None, :], X)
    return X


@triton.jit
def _inv_blocks_last(Lt, N: tl.constexpr):
    """_inv_blocks_t with the block index last: Lt[j, i, b] = L_b[i, j] [N, N, NB] -> X[r, c, b]. Loaded with j
    contiguous, the blocks are the slowest axis, so the warps split the blocks and every reduction of the N - 1
    dependent steps stays inside a warp."""
    r = tl.arange(0, N)
    R = r[:, None, None]
    C = r[None, :, None]
    X = tl.where(R == C, 1.0, 0.0) + tl.zeros_like(Lt)
    for i in tl.static_range(1, N):
        li = tl.sum(tl.where(C == i, Lt, 0.0), 1)
        upd = tl.sum(li[:, None, :] * X, 0)
        X = tl.where(R == i, X - upd[None, :, :], X)
    return X


@triton.jit
def _split_halves(Lt, NB: tl.constexpr, N: tl.constexpr):
    """From transposed blocks Lt[b, j, i] = L_b[i, j] [NB, N, N], with L_b = [[A, 0], [C, D]] in halves: the
    transposed diagonal halves [2 NB, N/2, N/2] (A_b, D_b for each b) and c_t[b, j, r] = C_b[r, j]."""
    S: tl.constexpr = N // 2
    h = tl.arange(0, 2)
    JH = h[None, :, None, None, None]
    IH = h[None, None, None, :, None]
    # [b, jh, jl, ih, il] = L_b[S ih + il, S jh + jl]
    Lt5 = tl.reshape(Lt, [NB, 2, S, 2, S])
    diag_t = tl.reshape(tl.sum(tl.where(JH == IH, Lt5, 0.0), 3), [2 * NB, S, S])
    c_t = tl.sum(tl.sum(tl.where((JH == 0) & (IH == 1), Lt5, 0.0), 3), 1)
    return diag_t, c_t


@triton.jit
def _merge_halves(X, c_t, NB: tl.constexpr, N: tl.constexpr):
    """(I + L_b)^-1 = [[Ai, 0], [-Di C Ai, Di]] [NB, N, N] from the halves' inverses X [2 NB, N/2, N/2] (Ai, Di
    for each b): the corner is two fp32 products on the CUDA cores (exact, unlike a tf32 merge)."""
    S: tl.constexpr = N // 2
    h = tl.arange(0, 2)
    X4 = tl.reshape(X, [NB, 2, S, S])
    H4 = h[None, :, None, None]
    a_inv = tl.sum(tl.where(H4 == 0, X4, 0.0), 1)
    d_inv = tl.sum(tl.where(H4 == 1, X4, 0.0), 1)
    # C Ai: [b, j, r, c] summed over j; then -Di (C Ai): [b, r, j, c] summed over j
    ca = tl.sum(c_t[:, :, :, None] * a_inv[:, :, None, :], 1)
    corner = -tl.sum(d_inv[:, :, :, None] * ca[:, None, :, :], 2)
    RH = h[None, :, None, None, None]
    CH = h[None, None, None, :, None]
    out = tl.where(RH == CH, X4[:, :, :, None, :],
                   tl.where((RH == 1) & (CH == 0), corner[:, None, :, None, :], 0.0))
    return tl.reshape(out, [NB, N, N])


@triton.jit
def _inv_by_halves(Lt, NB: tl.constexpr, N: tl.constexpr):
    """_inv_blocks_t in about half the dependent steps: all 2 NB diagonal halves are substituted at once (N/2 - 1
    steps instead of N - 1) and each corner is merged by _merge_halves."""
    diag_t, c_t = _split_halves(Lt, NB, N)
    return _merge_halves(_inv_blocks_t(diag_t, 2 * NB, N // 2), c_t, NB, N)


@triton.jit
def _aqk_dot(a, b_t, acc, op_ty: tl.constexpr, AQK_OPS: tl.constexpr):
    """acc + a @ b_t for fp32 tiles a [M, D] and b_t [D, N]: one product of the tiles rounded to the inputs' dtype
    (AQK_OPS 0; u = 2^-8 in bf16), three, a_hi b_hi + a_lo b_hi + a_hi b_lo with x_lo = x - x_hi, which leaves the
    operands' rounding near u^2 (1; the a_lo b_lo term is below that), or one tf32 product (2; u = 2^-11)."""
    if AQK_OPS == 2:
        acc = tl.dot(a, b_t, acc, input_precision="tf32")
    else:
        a_hi = a.to(op_ty)
        b_hi = b_t.to(op_ty)
        acc = tl.dot(a_hi, b_hi, acc)
        if AQK_OPS == 1:
            acc = tl.dot((a - a_hi.to(tl.float32)).to(op_ty), b_hi, acc)
            acc = tl.dot(a_hi, (b_t - b_hi.to(tl.float32)).to(op_ty), acc)
    return acc


@triton.jit
def _chunk_slice(kk, qb, kb, gb, w, qg, kg, gcb, mid_row, rmask, scale, H, akk, aqk_acc, reach,
                 K: tl.constexpr, BK: tl.constexpr, AQK_OPS: tl.constexpr):
    """One BK-column slice of the chunk-start-anchored products: stores its columns of qg, kg, Gamma K (into w)
    and gc, adds its part of Akk and Aqk (anchor 0, the row before the chunk) and raises reach, the largest -G of
    each row over the channels seen so far."""
    LN2INV: tl.constexpr = 1.4426950408889634
    op_ty: tl.constexpr = qb.dtype.element_ty
    r64 = tl.arange(0, 64)
    rr = r64[:, None]
    cols = kk + tl.arange(0, BK)
    gl = _rows_tile(gb, r64, rmask, H * K, cols) * LN2INV
    G = tl.cumsum(gl, 0)
    gC = tl.sum(tl.where(rr == 63, G, 0.0), 0)
    kt = _rows_tile(kb, r64, rmask, H * K, cols)
    eG = tl.exp2(G)
    _store_chunk(kg + mid_row * K, K, cols, kt * tl.exp2(gC[None, :] - G))
    tl.store(gcb + cols, tl.exp2(gC))
    rk = kt * eG
    # Gamma K, parked in w until M diag(beta) is known
    _store_chunk(w + mid_row * K, K, cols, rk)
    rq = _rows_tile(qb, r64, rmask, H * K, cols) * (eG * scale)
    _store_chunk(qg + mid_row * K, K, cols, rq)
    # column factors 2^-G_j, clamped at 2^REACH: exact for every row whose reach is below REACH (its columns j <= r
    # have -G_j <= -G_r), finite for every other row, whose products _blocked_slice redoes
    col_t = tl.trans(kt * tl.exp2(tl.minimum(-G, REACH)))
    akk = tl.dot(rk.to(op_ty), col_t.to(op_ty), akk)
    aqk_acc = _aqk_dot(rq, col_t, aqk_acc, op_ty, AQK_OPS)
    return akk, aqk_acc, tl.maximum(reach, tl.max(-G, 1))


@triton.jit
def _blocked_slice(kk, blk, qb, kb, gb, rmask, far, scale, H, akk, aqk_acc, K: tl.constexpr, BK: tl.constexpr,
                   AQK_OPS: tl.constexpr):
    """One BK-column slice of Akk and Aqk for the far rows of 16-row block `blk` (1-3) only (rows whose decay
    from the chunk start reaches REACH on some channel), around the block's own past anchor c, the row before it:
    rows 2^(G_r - c) <= 1, columns 2^min(c - G_j, REACH), which is 2^(c - G_j) <= 2^115.4 for every column the
    block's rows keep (j <= r, g >= -5) and finite for the rest. Rows 0-15 never reach REACH for g >= -5 (at
    most 115.4), so block 0 is not redone. One block a call, so this body holds no more tiles than _chunk_slice
    and the kernel that carries it needs no more registers."""
    LN2INV: tl.constexpr = 1.4426950408889634
    op_ty: tl.constexpr = qb.dtype.element_ty
    r64 = tl.arange(0, 64)
    rr = r64[:, None]
    cols = kk + tl.arange(0, BK)
    G = tl.cumsum(_rows_tile(gb, r64, rmask, H * K, cols) * LN2INV, 0)
    c = tl.sum(tl.where(rr == 16 * blk - 1, G, 0.0), 0)
    kt = _rows_tile(kb, r64, rmask, H * K, cols)
    m = (rr // 16 == blk) & far[:, None]
    rowf = tl.where(m, tl.exp2(G - c[None, :]), 0.0)
    col_t = tl.trans(kt * tl.exp2(tl.minimum(c[None, :] - G, REACH)))
    akk = tl.dot((kt * rowf).to(op_ty), col_t.to(op_ty), akk)
    rq = _rows_tile(qb, r64, rmask, H * K, cols) * (rowf * scale)
    aqk_acc = _aqk_dot(rq, col_t, aqk_acc, op_ty, AQK_OPS)
    return akk, aqk_acc


@triton.jit
def _intra(qb, kb, gb, bt, w, qg, kg, aqk, aqk_lo, gcb, flagb, mid_row, rmask, scale, H, K: tl.constexpr,
           BK: tl.constexpr, AQK_OPS: tl.constexpr, AQK_LO: tl.constexpr, FAR: tl.constexpr):
    """Akk (returned as L = diag(beta) Akk, strictly lower, fp32) and, stored: Aqk (bf16, plus its rounding
    remainder in aqk_lo when AQK_LO), qg, kg, Gamma K (into w, until W replaces it) and gc, for one chunk.

    G = chunk-local cumulative log2 decay. Every product is first taken around the chunk start (anchor 0, a past
    row of every row): rows 2^G_r <= 1, columns 2^-G_j. That is exact and finite for each row r whose reach
    max_d -G_r[d] stays below REACH (2^-G_j <= 2^-G_r for j <= r), which is every row under the task's default
    and mild gates. Rows at or past it (a chunk decaying faster than REACH / 64 = 1.9 log2 per token on some
    channel: the g = -5 bound does) are zeroed and recomputed by _blocked_slice around 16-row past anchors. The
    row's own reach picks its path, so o_t still never depends on later tokens.

    FAR 0 (far_split) compiles without the second path: such a chunk is only flagged (flagb), and a second launch
    with FAR > 0 redoes the flagged chunks, so the common kernel carries neither its code nor its spills. FAR > 0
    is also the software pipelining depth of the second path's K loop (far_stages).
    """
    r64 = tl.arange(0, 64)
    rr = r64[:, None]
    cc = r64[None, :]
    akk = tl.zeros([64, 64], dtype=tl.float32)
    aqk_acc = tl.zeros([64, 64], dtype=tl.float32)
    reach = tl.zeros([64], dtype=tl.float32)
    for kk in range(0, K, BK):
        akk, aqk_acc, reach = _chunk_slice(kk, qb, kb, gb, w, qg, kg, gcb, mid_row, rmask, scale, H, akk,
                                           aqk_acc, reach, K, BK, AQK_OPS)
    far = reach >= REACH
    if FAR:
        if tl.max(far.to(tl.int32), 0) > 0:
            akk = tl.where(far[:, None], 0.0, akk)
            aqk_acc = tl.where(far[:, None], 0.0, aqk_acc)
            for blk in range(1, 4):
                for kk in tl.range(0, K, BK, num_stages=FAR):
                    akk, aqk_acc = _blocked_slice(kk, blk, qb, kb, gb, rmask, far, scale, H, akk, aqk_acc, K,
                                                  BK, AQK_OPS)
    else:
        tl.store(flagb, tl.max(far.to(tl.int32), 0))
    aqk_acc = tl.where(rr >= cc, aqk_acc, 0.0)
    hi = aqk_acc.to(aqk.dtype.element_ty)
    _store_chunk(aqk + mid_row * 64, 64, r64, hi)
    if AQK_LO:
        _store_chunk(aqk_lo + mid_row * 64, 64, r64, aqk_acc - hi.to(tl.float32))
    return tl.where(rr > cc, akk * bt[:, None], 0.0)


@triton.jit
def _wy(L, vb, betab, w, u, mbuf, scr, mid_row, rmask, H, K: tl.constexpr, V: tl.constexpr, BW: tl.constexpr,
        BVP: tl.constexpr, M_SCAN: tl.constexpr, INV_MEM: tl.constexpr):
    """M = (I + L)^-1 diag(beta) (beta folded into M's columns: one rounding of M beta instead of one of beta V),
    then by M_SCAN: 0, W = M (Gamma K) over the stash in w and U = M V; 1, W, with M stored for the scan's U = M V;
    2, M stored only (the scan forms V' = M (V - (Gamma K) S) from the stash)."""
    op_ty: tl.constexpr = vb.dtype.element_ty
    r64 = tl.arange(0, 64)
    rr = r64[:, None]
    cc = r64[None, :]
    # The four 16x16 diagonal blocks inverted in fp32 (D^-1: through the slot, or _inv_by_halves in registers),
    # then with Z = D^-1 N for the block-lower rest N (Z^4 = 0): (I + L)^-1 = D^-1 - Z (D^-1 - Z (D^-1 - Z D^-1)),
    # tf32 products. Row r of M involves rows <= r of L only.
    band = rr // 16 - cc // 16
    b4 = tl.arange(0, 4)
    same = b4[:, None, None, None] == b4[None, None, :, None]
    if INV_MEM:
        # scr: [0, 1024) the diagonal 16x16 blocks, [b, i, j] = L[16b + i, 16b + j], later D^-1's; [1024, 1536) the
        # eight 8x8 halves' inverses, transposed: [h, c, r] = X_h[r, c]
        tl.store(scr + ((rr // 16) * 256 + (rr % 16) * 16 + cc % 16), L, mask=band == 0)
        tl.debug_barrier()
        e8 = tl.arange(0, 8)
        J3 = e8[:, None, None]
        I3 = e8[None, :, None]
        H3 = e8[None, None, :]
        X = _inv_blocks_last(tl.load(scr + ((H3 // 2) * 256 + ((H3 % 2) * 8 + I3) * 16 + (H3 % 2) * 8 + J3)), 8)
        tl.store(scr + (1024 + H3 * 64 + I3 * 8 + J3), X)
        tl.debug_barrier()
        # corner of block b: -Di (C Ai) with C = L[16b + 8 + r, 16b + j]; [r, j, c, b] products summed over j
        R4 = e8[:, None, None, None]
        J4 = e8[None, :, None, None]
        C4 = e8[None, None, :, None]
        B4 = b4[None, None, None, :]
        cb = tl.load(scr + (B4 * 256 + (8 + R4) * 16 + J4 + C4 * 0))
        ai = tl.load(scr + (1024 + 2 * B4 * 64 + C4 * 8 + J4 + R4 * 0))
        ca = tl.sum(cb * ai, 1)
        di = tl.load(scr + (1024 + (2 * B4 + 1) * 64 + J4 * 8 + R4 + C4 * 0))
        corner = -tl.sum(di * ca[None, :, :, :], 1)
        tl.debug_barrier()
        R3 = e8[:, None, None]
        C3 = e8[None, :, None]
        B3 = b4[None, None, :]
        tl.store(scr + ((H3 // 2) * 256 + ((H3 % 2) * 8 + J3) * 16 + (H3 % 2) * 8 + I3), X)
        tl.store(scr + (B3 * 256 + (8 + R3) * 16 + C3), corner)
        tl.debug_barrier()
        # the upper right 8x8 of each block still holds L's zeros
        dinv = tl.load(scr + ((rr // 16) * 256 + (rr % 16) * 16 + cc % 16), mask=band == 0, other=0.0)
    else:
        # [b, j, i] = L[16b + i, 16b + j]: one transpose here instead of one per substitution step
        lt_blocks = tl.sum(tl.where(same, tl.reshape(tl.trans(L), [4, 16, 4, 16]), 0.0), 2)
        dinv3 = _inv_by_halves(lt_blocks, 4, 16)
        dinv = tl.reshape(tl.where(same, dinv3[:, :, None, :], 0.0), [64, 64])
    z = tl.dot(dinv, tl.where(band >= 1, L, 0.0))
    p = tl.dot(z, dinv)
    p = tl.dot(z, dinv - p)
    p = tl.dot(z, dinv - p)
    # beta is loaded here rather than kept live across the inversion (registers); rows past T have beta 0
    bt = tl.load(betab + r64 * H, mask=rmask, other=0.0).to(tl.float32)
    m_o = ((dinv - p) * bt[None, :]).to(op_ty)
    if M_SCAN:
        _store_chunk(mbuf + mid_row * 64, 64, r64, m_o)
    if M_SCAN < 2:
        for kk in tl.static_range(0, K, BW):
            cols = kk + tl.arange(0, BW)
            xw = tl.load(w + mid_row * K + (rr * K + cols[None, :]))
            _store_chunk(w + mid_row * K, K, cols, tl.dot(m_o, xw))
    if M_SCAN == 0:
        for vv in tl.static_range(0, V, BVP):
            cols = vv + tl.arange(0, BVP)
            y = tl.load(vb + (r64[:, None] * (H * V) + cols[None, :]), mask=rmask[:, None], other=0.0)
            _store_chunk(u + mid_row * V, V, cols, tl.dot(m_o, y))


@triton.jit
def _chunk_setup(T, NT, H, ORDER: tl.constexpr):
    """Program -> (row of token t0 in [B, T, H, *] inputs, row of the chunk in [B*H, NT*64, *] intermediates,
    row mask). ORDER 0: grid (NT, B*H), the chunks of one head launched together; 1: grid (B*H, NT), the heads of
    one chunk together (neighbouring programs then read neighbouring 256 B pieces of the same input rows)."""
    if ORDER:
        i_bh = tl.program_id(0)
        i_t = tl.program_id(1)
    else:
        i_t = tl.program_id(0)
        i_bh = tl.program_id(1)
    t0 = i_t * 64
    # inputs are [B, T, H, D]: token t of (b, h) sits at row (b*T + t)*H + h
    in_row = ((i_bh // H).to(tl.int64) * T + t0) * H + i_bh % H
    # intermediates are [B*H, NT*64, D], chunk-contiguous for the scan
    mid_row = (i_bh.to(tl.int64) * NT + i_t) * 64
    r64 = tl.arange(0, 64)
    rmask = t0 + r64 < T
    return in_row, mid_row, rmask


@triton.jit
def _prep_chunk(q, k, v, g, beta, w, u, mbuf, qg, kg, aqk, aqk_lo, gc, lbuf, flag, in_row, mid_row, rmask, scale,
                H, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BW: tl.constexpr, BVP: tl.constexpr,
                AQK_OPS: tl.constexpr, AQK_LO: tl.constexpr, FAR: tl.constexpr, WY: tl.constexpr,
                M_SCAN: tl.constexpr, INV_MEM: tl.constexpr):
    bt = tl.load(beta + in_row + tl.arange(0, 64) * H, mask=rmask, other=0.0).to(tl.float32)
    L = _intra(q + in_row * K, k + in_row * K, g + in_row * K, bt, w, qg, kg, aqk, aqk_lo,
               gc + mid_row // 64 * K, flag + mid_row // 64, mid_row, rmask, scale, H, K, BK, AQK_OPS, AQK_LO,
               FAR)
    if WY:
        if M_SCAN < 2:
            # the stash of Gamma K in w was written by other threads of this program
            tl.debug_barrier()
        # inv_mem's scratch: one slot a chunk
        scr = lbuf + mid_row // 64 * INV_SLOT
        _wy(L, v + in_row * V, beta + in_row, w, u, mbuf, scr, mid_row, rmask, H, K, V, BW, BVP, M_SCAN, INV_MEM)
    else:
        # prep_split: L (fp32, exact) goes to _kda_wy, a kernel of fewer registers
        _store_chunk(lbuf + mid_row * 64, 64, tl.arange(0, 64), L)


@triton.jit(do_not_specialize=["T", "NT", "H"])
def _kda_prep(q, k, v, g, beta, w, u, mbuf, qg, kg, aqk, aqk_lo, gc, lbuf, flag, T, NT, scale, H,
              K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BW: tl.constexpr, BVP: tl.constexpr,
              AQK_OPS: tl.constexpr, AQK_LO: tl.constexpr, FAR: tl.constexpr, FLAGGED: tl.constexpr,
              WY: tl.constexpr, ORDER: tl.constexpr, M_SCAN: tl.constexpr, INV_MEM: tl.constexpr):
    """Everything chunk-parallel, for one (chunk, head); with WY, L never leaves registers. FLAGGED: only the
    chunks that a FAR 0 launch flagged (far_split's second launch); the others return at once."""
    in_row, mid_row, rmask = _chunk_setup(T, NT, H, ORDER)
    if FLAGGED:
        if tl.load(flag + mid_row // 64) != 0:
            _prep_chunk(q, k, v, g, beta, w, u, mbuf, qg, kg, aqk, aqk_lo, gc, lbuf, flag, in_row, mid_row,
                        rmask, scale, H, K, V, BK, BW, BVP, AQK_OPS, AQK_LO, FAR, WY, M_SCAN, INV_MEM)
    else:
        _prep_chunk(q, k, v, g, beta, w, u, mbuf, qg, kg, aqk, aqk_lo, gc, lbuf, flag, in_row, mid_row, rmask,
                    scale, H, K, V, BK, BW, BVP, AQK_OPS, AQK_LO, FAR, WY, M_SCAN, INV_MEM)


@triton.jit(do_not_specialize=["T", "NT", "H"])
def _kda_wy(v, beta, w, u, mbuf, lbuf, T, NT, H, K: tl.constexpr, V: tl.constexpr, BW: tl.constexpr,
            BVP: tl.constexpr, ORDER: tl.constexpr, M_SCAN: tl.constexpr, INV_MEM: tl.constexpr):
    """prep_split's second kernel: M, W and U of one (chunk, head) from the L that _kda_prep stored (whose slot,
    once read, is inv_mem's scratch)."""
    in_row, mid_row, rmask = _chunk_setup(T, NT, H, ORDER)
    r64 = tl.arange(0, 64)
    L = tl.load(lbuf + mid_row * 64 + (r64[:, None] * 64 + r64[None, :]))
    if INV_MEM:
        tl.debug_barrier()
    _wy(L, v + in_row * V, beta + in_row, w, u, mbuf, lbuf + mid_row * 64, mid_row, rmask, H, K, V, BW, BVP, M_SCAN,
        INV_MEM)


@triton.jit(do_not_specialize=["T", "NT", "H"])
def _kda_scan(w, u, v, mbuf, qg, kg, aqk, aqk_lo, gc, h0, o, ht, T, NT, H, K: tl.constexpr, V: tl.constexpr,
              BV: tl.constexpr, HAS_H0: tl.constexpr, AQK_LO: tl.constexpr, M_SCAN: tl.constexpr):
    """The state recurrence of one (V-block, head) over its chunks. V' = U - W S from the prep's U and W
    (M_SCAN 0); = M V - W S with M V formed here (1); = M (V - (Gamma K) S), w holding Gamma K (2: a bf16
    product of M and the fp32 difference rounded to bf16)."""
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
    # o and v are [B, T, H, V]: the same offsets
    io_off = ((i_b.to(tl.int64) * T) * H + i_h) * V
    o_base = o + io_off
    mid = i_bh.to(tl.int64) * NT * 64
    for it in range(0, NT):
        r = mid + it * 64 + rt
        tok = it * 64 + rt
        Wt = tl.load(w + r[:, None] * K + ck[None, :])
        Qt = tl.load(qg + r[:, None] * K + ck[None, :])
        Kt = tl.load(kg + r[:, None] * K + ck[None, :])
        At = tl.load(aqk + r[:, None] * 64 + rt[None, :])
        gct = tl.load(gc + (i_bh.to(tl.int64) * NT + it) * K + ck)
        Sb = S.to(Wt.dtype)
        if M_SCAN == 0:
            Vp = tl.load(u + r[:, None] * V + cv[None, :]).to(tl.float32) - tl.dot(Wt, Sb)
        else:
            Mt = tl.load(mbuf + r[:, None] * 64 + rt[None, :])
            Vin = tl.load(v + io_off + tok[:, None] * (H * V) + cv[None, :], mask=(tok < T)[:, None], other=0.0)
            if M_SCAN == 1:
                Vp = tl.dot(Mt, Vin) - tl.dot(Wt, Sb)
            else:
                Vp = tl.dot(Mt, (Vin.to(tl.float32) - tl.dot(Wt, Sb)).to(Mt.dtype))
        Vb = Vp.to(Wt.dtype)
        Ot = tl.dot(At, Vb, tl.dot(Qt, Sb))
        if AQK_LO:
            Ot = tl.dot(tl.load(aqk_lo + r[:, None] * 64 + rt[None, :]), Vb, Ot)
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


def kda_chunked(q, k, v, g, beta, scale, initial_state, **overrides):
    """Chunked KDA forward with explicit launch parameters: keyword overrides of CONFIG (None keeps its value)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if K < 16 or V < 16 or K & (K - 1) or V & (V - 1):
        raise ValueError(f"kda_chunked needs K and V powers of two >= 16, got K={K}, V={V}")
    unknown = set(overrides) - set(CONFIG)
    if unknown:
        raise TypeError(f"kda_chunked got unknown launch parameters {sorted(unknown)}")
    cfg = dict(CONFIG, **{name: val for name, val in overrides.items() if val is not None})
    bv = min(cfg["BV"] or _pick_bv(B, H, V), V)
    bk = min(cfg["BK"], K)
    bvp = min(cfg["BVP"], V)
    # W = M (Gamma K) in 64-column slices whatever BK is: BK sets the K pass's slices only (W in 32-column
    # slices gave an illegal address or wrong o on the H200, as U in BVP 32 did)
    bw = min(64, K)
    if q.is_cuda and (bk < min(32, K) or bvp < min(64, V)):
        raise ValueError(f"kda_chunked: BK={bk}, BVP={bvp}: BK below 32 or BVP below 64 is not supported on CUDA "
                         "(unmeasured, and 32-column W or U products gave wrong o or an illegal address on the "
                         "H200)")
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    dev = q.device
    LAUNCHED.clear()
    NT = triton.cdiv(T, BT)
    # intermediates: chunk-padded, head-major, in the inputs' dtype (fp32 under the CPU interpreter)
    w = torch.empty(B * H, NT * BT, K, dtype=q.dtype, device=dev)
    qg = torch.empty_like(w)
    kg = torch.empty_like(w)
    m_scan = cfg["m_scan"]
    if m_scan not in (0, 1, 2):
        raise ValueError(f"kda_chunked: m_scan={m_scan}: M is applied in the prep (0) or the scan (1: U = M V; 2: "
                         "V' = M (V - (Gamma K) S)), nowhere else")
    # U = M V where the prep forms it (m_scan 0)
    u = torch.empty(B * H, NT * BT, V, dtype=q.dtype, device=dev) if m_scan == 0 else w
    aqk = torch.empty(B * H, NT * BT, BT, dtype=q.dtype, device=dev)
    # the rounding remainder of Aqk, read by the scan as a second product (aqk_lo); else never touched
    aqk_lo = torch.empty_like(aqk) if cfg["aqk_lo"] else aqk
    # M where the scan applies it (m_scan 1, 2)
    mbuf = torch.empty_like(aqk) if m_scan else w
    gc = torch.empty(B * H, NT, K, dtype=torch.float32, device=dev)
    o = torch.empty(B, T, H, V, dtype=v.dtype, device=dev)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=dev)
    # far_split: one flag per chunk, written by the first launch for every chunk; prep_split: L per chunk (fp32)
    flag = torch.empty(B * H * NT, dtype=torch.int32, device=dev) if cfg["far_split"] else gc
    lbuf = torch.empty(B * H, NT * BT, BT, dtype=torch.float32, device=dev) if cfg["prep_split"] else gc
    if cfg["inv_mem"] not in (0, 1):
        raise ValueError(f"kda_chunked: inv_mem={cfg['inv_mem']}: the diagonal blocks go through registers (0) or "
                         "a scratch slot (1), nothing else")
    if cfg["inv_mem"] and not cfg["prep_split"]:
        # inv_mem's scratch, one slot a chunk (prep_split's L slots serve once read)
        lbuf = torch.empty(B * H * NT, INV_SLOT.value, dtype=torch.float32, device=dev)
    grid = (B * H, NT) if cfg["prep_order"] else (NT, B * H)
    prep_args = (q, k, v, g, beta, w, u, mbuf, qg, kg, aqk, aqk_lo, gc, lbuf, flag, T, NT, float(scale), H)
    prep_kw = dict(K=K, V=V, BK=bk, BW=bw, BVP=bvp, AQK_OPS=cfg["aqk_ops"], AQK_LO=cfg["aqk_lo"],
                   WY=not cfg["prep_split"], ORDER=cfg["prep_order"], M_SCAN=m_scan,
                   INV_MEM=0 if cfg["prep_split"] else cfg["inv_mem"],
                   num_warps=cfg["prep_warps"], num_stages=cfg["prep_stages"])
    # the register cap applies to the first launch only: the flagged one carries the second path, which spills
    # heavily under a cap (704 B at 128)
    LAUNCHED["prep"] = _kda_prep[grid](*prep_args, FAR=0 if cfg["far_split"] else cfg["far_stages"], FLAGGED=False,
                                       maxnreg=cfg["prep_nreg"] or None, **prep_kw)
    if cfg["far_split"]:
        LAUNCHED["prep_far"] = _kda_prep[grid](*prep_args, FAR=cfg["far_stages"], FLAGGED=True, **prep_kw)
    if cfg["prep_split"]:
        LAUNCHED["wy"] = _kda_wy[grid](v, beta, w, u, mbuf, lbuf, T, NT, H, K=K, V=V, BW=bw, BVP=bvp,
                                       ORDER=cfg["prep_order"], M_SCAN=m_scan, INV_MEM=cfg["inv_mem"],
                                       num_warps=cfg["wy_warps"],
                                       num_stages=cfg["prep_stages"])
    h0 = initial_state.contiguous() if initial_state is not None else ht
    LAUNCHED["scan"] = _kda_scan[(V // bv, B * H)](
        w, u, v, mbuf, qg, kg, aqk, aqk_lo, gc, h0, o, ht, T, NT, H, K=K, V=V, BV=bv, HAS_H0=initial_state is not None,
        AQK_LO=cfg["aqk_lo"], M_SCAN=m_scan, num_warps=cfg["scan_warps"], num_stages=cfg["scan_stages"])
    return o, ht


def forward(q, k, v, g, beta, scale, initial_state):
    """KDA forward: returns (o [B,T,H,V] in v's dtype, final_state [B,H,K,V] fp32). Needs g in [-5, 0]."""
    return kda_chunked(q, k, v, g, beta, scale, initial_state)
