"""Our split-KV MLA decode: stage 1 reads each latent tile once for QK and PV over all heads, stage 2 merges splits."""

import functools

import torch
import triton
import triton.language as tl

TUNABLES = {"BLOCK_N": [16, 32, 64], "num_stages": [2, 3, 4, 6, 8], "num_splits": [0, 16, 32, 64, 128],
            "LAZY_RESCALE": [False, True], "BLOCK_H": [16, 32, 64], "num_warps": [4, 8],
            "LOAD": ["masked", "peeled", "tma"], "MERGE_BLOCK_D": [0, 32, 64, 128, 256, 512],
            "MERGE_HEADS": [1, 2, 4, 8, 16], "PDL": [False, True]}
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
CONFIG = {"BLOCK_N": 64, "num_stages": 2, "num_splits": 0, "LAZY_RESCALE": False, "BLOCK_H": 64, "num_warps": 8,
          "LOAD": "tma", "MERGE_BLOCK_D": 0, "MERGE_HEADS": 8, "PDL": False}

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
def _mla_split_attend(
    Q, KV, SEQLENS, O, LSE, OP, LSEP, KV_LAT_DESC, KV_ROPE_DESC,
    qk_scale, split_len,
    stride_qb, stride_qh, stride_kvb, stride_kvn, stride_ob, stride_oh,
    H, N, num_splits,
    D_LAT: tl.constexpr, D_ROPE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    SINGLE: tl.constexpr, LAZY_RESCALE: tl.constexpr, LOAD: tl.constexpr, PDL: tl.constexpr,
):
    """One (head group, split, batch row): online softmax over rows [s*split_len, min((s+1)*split_len, len)).

    With SINGLE the split is the whole row and the program writes the final o and lse; otherwise it writes o
    normalised by its own denominator (in OP's dtype) and lse in log2 units to the partial buffers, and writes
    nothing at all when the split is empty (stage 2 skips it by the same bounds).
    LOAD 0 masks every tile; 1 and 2 peel the last partial tile off, so the full tiles load unmasked (2: through
    the TMA descriptors over the cache viewed as [B*N, 576]) and only the tail pays for the mask. Rows past the
    length may hold anything, NaN included, so the tail always goes through a masked load that zeroes them.
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
    kv_ptr = KV + b * stride_kvb
    if LOAD == 0:
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            row_ptr = kv_ptr + offs_n[:, None] * stride_kvn
            c = tl.load(row_ptr + offs_c[None, :], mask=mask_n[:, None], other=0.0)
            r = tl.load(row_ptr + D_LAT + offs_r[None, :], mask=mask_n[:, None], other=0.0)
            m_i, l_i, acc = _attend_tile(q_lat, q_rope, c, r, mask_n, m_i, l_i, acc, qk_scale, True, LAZY_RESCALE)
        tail = end
    else:
        tail = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
        for n0 in range(start, tail, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            if LOAD == 2:
                # Global row of the [B*N, 576] view; every row of a full tile is below the length.
                row = (b * N).to(tl.int32) + n0
                c = KV_LAT_DESC.load([row, 0])
                r = KV_ROPE_DESC.load([row, D_LAT])
            else:
                row_ptr = kv_ptr + offs_n[:, None] * stride_kvn
                c = tl.load(row_ptr + offs_c[None, :])
                r = tl.load(row_ptr + D_LAT + offs_r[None, :])
            m_i, l_i, acc = _attend_tile(q_lat, q_rope, c, r, offs_n, m_i, l_i, acc, qk_scale, False,
                                         LAZY_RESCALE)
        if tail < end:
            offs_n = tail + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            row_ptr = kv_ptr + offs_n[:, None] * stride_kvn
            c = tl.load(row_ptr + offs_c[None, :], mask=mask_n[:, None], other=0.0)
            r = tl.load(row_ptr + D_LAT + offs_r[None, :], mask=mask_n[:, None], other=0.0)
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
    """Whether the cache can be viewed as [B*N, 576] rows for TMA: contiguous, and 16-byte aligned as TMA needs.

    The default load mode is "tma"; a cache that fails this (a strided view, an odd offset) takes the "peeled"
    path, which reads the same full tiles through plain pointers, instead of failing the call.
    """
    batch, n, width = kv_cache.shape
    contiguous = kv_cache.stride(2) == 1 and kv_cache.stride(1) == width and (batch == 1 or
                                                                             kv_cache.stride(0) == n * width)
    return contiguous and kv_cache.data_ptr() % 16 == 0 and (width * kv_cache.element_size()) % 16 == 0


def _descriptors(kv_cache: torch.Tensor, block_n: int):
    """TMA descriptors for the latent and rope columns of the cache viewed as [B*N, 576] (rows contiguous).

    Built on the host per call (a few microseconds of Python, no GPU work), so a CUDA graph captures them by
    value like any other kernel argument. A tile never crosses into the next batch row: only full tiles, which lie
    below that row's length, go through them. The caller has checked tma_ok.
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    batch, n, width = kv_cache.shape
    flat = kv_cache.as_strided((batch * n, width), (width, 1))
    return (TensorDescriptor.from_tensor(flat, [block_n, D_LATENT]),
            TensorDescriptor.from_tensor(flat, [block_n, D_ROPE]))


def attend_into(q, kv_cache, cache_seqlens, sm_scale, o, lse, o_part, lse_part, splits: int, split_len: int,
                config: dict | None = None):
    """Launch stage 1 (and stage 2 when splits > 1) into caller-owned buffers.

    Separate from forward so tests can hand in NaN-filled scratch and prove that empty splits are never read.
    """
    cfg = resolve(config)
    batch, heads, _ = q.shape
    n = kv_cache.shape[1]
    single = splits == 1
    if single:
        o_part, lse_part = o, lse
    load = _LOAD_MODES[cfg["LOAD"]]
    if load == 2 and not tma_ok(kv_cache):
        load = 1
    lat_desc, rope_desc = _descriptors(kv_cache, cfg["BLOCK_N"]) if load == 2 else (None, None)
    # Grid dependency control is a Hopper launch attribute; the interpreter neither has nor needs it.
    pdl = bool(cfg["PDL"]) and q.is_cuda and not single
    block_h = cfg["BLOCK_H"]
    grid = (triton.cdiv(heads, block_h), splits, batch)
    _mla_split_attend[grid](
        q, kv_cache, cache_seqlens, o, lse, o_part, lse_part, lat_desc, rope_desc,
        float(sm_scale) * LOG2E, split_len,
        q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), o.stride(0), o.stride(1),
        heads, n, splits,
        D_LAT=D_LATENT, D_ROPE=D_ROPE, BLOCK_H=block_h, BLOCK_N=cfg["BLOCK_N"], SINGLE=single,
        LAZY_RESCALE=cfg["LAZY_RESCALE"], LOAD=load, PDL=pdl,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if not single:
        block_s = triton.next_power_of_2(splits)
        # MERGE_HEADS is a ceiling: rows x splits x 32 columns must stay within 8K floats, so at 128 splits
        # (M1) it drops to 2 rows while at 4 splits (M3) 8 rows fit.
        block_m = min(cfg["MERGE_HEADS"], max(1, 8192 // (block_s * 32)))
        # Keep the [rows, splits, BLOCK_D] partial tile near 8K floats: 64 registers a thread at 4 warps, with
        # warps added (up to 8) when a forced MERGE_BLOCK_D makes it bigger.
        block_d = cfg["MERGE_BLOCK_D"] or max(32, min(D_LATENT, 8192 // (block_s * block_m)))
        warps = min(8, max(4, block_m * block_s * block_d // 2048))
        extra = {"launch_pdl": True} if pdl else {}
        _mla_merge_splits[(triton.cdiv(batch * heads, block_m), D_LATENT // block_d)](
            o_part, lse_part, cache_seqlens, o, lse,
            split_len, o.stride(0), o.stride(1), heads, batch * heads, splits,
            D_LAT=D_LATENT, BLOCK_M=block_m, BLOCK_S=block_s, BLOCK_D=block_d, PDL=pdl, num_warps=warps,
            **extra,
        )


def forward(q, kv_cache, cache_seqlens, sm_scale, num_splits: int = 0, config: dict | None = None):
    """o [B,H,512] in q's dtype and lse [B,H] fp32; num_splits > 0 forces the split count (tests, sweeps), and
    config overrides CONFIG keys for this call only (variant sweeps).

    Thin on purpose: shapes decide everything, so a call is two launches (one when a single split covers N),
    needs no host sync and captures into a CUDA graph.
    """
    batch, heads, _ = q.shape
    splits, split_len = split_plan(batch, heads, kv_cache.shape[1], q.device, num_splits, config=config)
    o = torch.empty(batch, heads, D_LATENT, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, heads, dtype=torch.float32, device=q.device)
    o_part, lse_part = (o, lse) if splits == 1 else partial_buffers(batch, heads, splits, q.device, q.dtype)
    attend_into(q, kv_cache, cache_seqlens, sm_scale, o, lse, o_part, lse_part, splits, split_len, config)
    return o, lse
