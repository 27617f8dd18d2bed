"""Trusted oracle and input generator for MLA absorbed decode (one query token per sequence)."""

import math

import torch

D_LATENT = 512
"""Width of the compressed latent c_t: the key's first 512 dims and the whole value."""
D_ROPE = 64
"""Width of the decoupled RoPE key kr_t, stored after the latent in every cache row."""
D_QK = D_LATENT + D_ROPE


def _seqlens(batch: int, n: int, mode: str, gen: torch.Generator) -> torch.Tensor:
    """Per-row valid lengths; 'ragged' pins the edge cases a split-KV kernel gets wrong.

    Row 0 has length 1 (every split but the first is empty), row 1 the full N, and the rest are random lengths
    moved off multiples of 16 so that no block size divides them.
    """
    if mode == "full":
        return torch.full((batch,), n, dtype=torch.int32)
    if mode != "ragged":
        raise ValueError(f"mla_decode: unknown lengths mode {mode!r} (expected 'full' or 'ragged')")
    lens = torch.randint(1, n + 1, (batch,), generator=gen, dtype=torch.int64)
    lens = torch.where((lens % 16 == 0) & (lens > 1), lens - 1, lens)
    lens[0] = 1
    if batch > 1:
        lens[1] = n
    return lens.to(torch.int32)


UNUSED_PAGE = -1
"""Block-table entry past a row's last used page: no page at all, so a kernel that reads it fails."""


def _block_table(lens: torch.Tensor, pages_per_row: int, page_size: int, gen: torch.Generator) -> tuple:
    """(block table [B, pages_per_row] int32, page count): every row's pages drawn from one shuffled pool.

    The pool has a spare page per row beyond the ones the table uses, so the cache is not exactly the pages in use,
    and entries past a row's last used page are UNUSED_PAGE, as in a serving engine's table for a short sequence.
    """
    batch = lens.shape[0]
    num_pages = batch * (pages_per_row + 1)
    table = torch.randperm(num_pages, generator=gen)[: batch * pages_per_row].view(batch, pages_per_row)
    used = (lens.to(torch.int64) + page_size - 1) // page_size
    table = table.masked_fill(torch.arange(pages_per_row)[None, :] >= used[:, None], UNUSED_PAGE)
    return table.to(torch.int32), num_pages


def make_inputs(shape: dict, seed: int, device: str) -> dict[str, object]:
    """Random absorbed queries and latent cache for one shape.

    Params: B, H, N (required); dtype ("bfloat16" default, "float32" for the CPU interpreter, whose bf16 dot is
    unreliable); lengths ("full" default, or "ragged"); scale_dim (sm_scale = scale_dim**-0.5, default 192 as in
    DeepSeek's model code; shapes with 576 catch kernels that hard-code the scale); qscale (multiplies q, default
    1; large values make scores of magnitude ~100 that overflow exp without a running max); page_size (absent: one
    contiguous [B, N, 576] cache; else a paged cache as serving engines keep it, kv_cache [pages, page_size, 576] in
    shuffled pages and block_table [B, ceil(N / page_size)] int32 naming each row's pages in order).
    Big tensors are drawn on the target device so that M4 (2.4 GB of cache) does not take seconds on the host.
    """
    b, h, n = int(shape["B"]), int(shape["H"]), int(shape["N"])
    dtype = getattr(torch, shape.get("dtype", "bfloat16"))
    gen_host = torch.Generator().manual_seed(seed)
    gen_dev = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(b, h, D_QK, generator=gen_dev, device=device) * float(shape.get("qscale", 1.0))
    lens = _seqlens(b, n, shape.get("lengths", "full"), gen_host)
    inputs: dict[str, object] = {"q": q.to(dtype)}
    if "page_size" in shape:
        page_size = int(shape["page_size"])
        table, num_pages = _block_table(lens, -(-n // page_size), page_size, gen_host)
        inputs["kv_cache"] = torch.randn(num_pages, page_size, D_QK, generator=gen_dev, device=device).to(dtype)
        inputs["block_table"] = table.to(device)
    else:
        inputs["kv_cache"] = torch.randn(b, n, D_QK, generator=gen_dev, device=device).to(dtype)
    inputs["cache_seqlens"] = lens.to(device)
    inputs["sm_scale"] = float(shape.get("scale_dim", 192)) ** -0.5
    return inputs


def gather_pages(kv_cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """A paged cache as the contiguous [B, pages_per_row * page_size, 576] one it stands for.

    Unused entries read page 0: the rows they cover lie past the row's length, which nothing may use.
    """
    batch, pages = block_table.shape
    rows = kv_cache[block_table.clamp(min=0).to(torch.int64)]
    return rows.view(batch, pages * kv_cache.shape[1], kv_cache.shape[2])


def forward(q, kv_cache, cache_seqlens, sm_scale, block_table=None):
    """Exact masked attention in float64; returns (o [B,H,512] fp32, lse [B,H] fp32, natural log).

    float64 everywhere (not only on small shapes): the largest benchmark shape needs about 3 GB and a few ms of
    DGEMM, and it removes any question of TF32 creeping into an fp32 einsum. A paged cache is gathered into the
    contiguous one first (FlashInfer-Bench's paged definitions return lse in base 2; this task keeps natural log).
    """
    if block_table is not None:
        kv_cache = gather_pages(kv_cache, block_table)
    qd = q.to(torch.float64)
    kvd = kv_cache.to(torch.float64)
    n = kv_cache.shape[1]
    scores = torch.einsum("bhd,bnd->bhn", qd, kvd) * sm_scale
    pad = torch.arange(n, device=q.device)[None, :] >= cache_seqlens.to(torch.int64)[:, None]
    scores = scores.masked_fill(pad[:, None, :], -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - lse[..., None])
    o = torch.einsum("bhn,bnd->bhd", p, kvd[..., :D_LATENT])
    return o.to(torch.float32), lse.to(torch.float32)


def output_dtypes(q, kv_cache, cache_seqlens, sm_scale, block_table=None):
    """What a candidate returns: o in the working dtype (bf16 on the GPU shapes), lse always fp32.

    The oracle itself returns fp32 o so that its error is not rounded to bf16 before the comparison.
    """
    return [q.dtype, torch.float32]
