"""PyTorch baseline for MLA decode: the plain form a user writes (two bf16 matmuls around fp32 scores and one
logsumexp), and the same function under torch.compile.

Runs only in the trusted process. benchmarks/mla_baselines.py times every form here against the previous baseline
(separate masked softmax and logsumexp passes) on the H200; `forward` is the fastest correct one (see task.toml).
"""

import torch

NAME = "torch.compile(bmm, fp32 logsumexp, exp, bmm)"
D_LATENT = 512


def available() -> bool:
    """Plain PyTorch ops only, so the baseline exists wherever torch does."""
    return True


def plain(q, kv_cache, cache_seqlens, sm_scale, block_table=None):
    """Scores from a bf16 matmul (fp32 accumulation, bf16 result) taken to fp32 and scaled, rows past each length
    masked, lse from one logsumexp and p = exp(scores - lse) from the same scores, then p in bf16 times the latent.

    A paged cache is first gathered into the contiguous one it stands for, as a PyTorch user would (entries past a
    row's pages are -1: clamped, their rows are masked anyway). The mask is one pass over the scores whatever the
    lengths: knowing that all rows are full would take a host sync, which a decode step (and a graph) cannot have.
    """
    if block_table is not None:
        kv_cache = kv_cache[block_table.clamp(min=0).long()].flatten(1, 2)
    n = kv_cache.shape[1]
    scores = torch.bmm(q, kv_cache.transpose(1, 2)).float().mul_(sm_scale)
    pad = torch.arange(n, device=q.device)[None, :] >= cache_seqlens[:, None]
    scores.masked_fill_(pad[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    p = scores.sub_(lse[..., None]).exp_().to(q.dtype)
    return torch.bmm(p, kv_cache[..., :D_LATENT]), lse


_COMPILED: dict = {}


def compiled(q, kv_cache, cache_seqlens, sm_scale, block_table=None, dynamic: bool | None = None):
    """plain under torch.compile (inductor, default mode): the scale, mask, logsumexp and exp fuse into one or two
    kernels between the two matmuls. dynamic=None is torch.compile's default (the first shape compiled static, sizes
    made symbolic when a second shape comes); False compiles every shape; True starts symbolic."""
    fn = _COMPILED.get(dynamic)
    if fn is None:
        fn = _COMPILED[dynamic] = torch.compile(plain, dynamic=dynamic)
    return fn(q, kv_cache, cache_seqlens, sm_scale, block_table)


def forward(q, kv_cache, cache_seqlens, sm_scale, block_table=None):
    """The shipped baseline: plain under torch.compile on a GPU, the fastest correct form on every shape in the same
    run (task.toml has the figures); plain eager on the CPU shapes, where an inductor build would cost more than the
    interpreted candidate."""
    if q.is_cuda:
        return compiled(q, kv_cache, cache_seqlens, sm_scale, block_table)
    return plain(q, kv_cache, cache_seqlens, sm_scale, block_table)
