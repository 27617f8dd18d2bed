"""PyTorch baseline for MLA decode: two bf16 batched matmuls around an fp32 softmax, as a user would write it."""

import torch

NAME = "torch.bf16 (matmul, softmax, matmul)"
D_LATENT = 512


def available() -> bool:
    """Plain PyTorch ops only, so the baseline exists wherever torch does."""
    return True


def forward(q, kv_cache, cache_seqlens, sm_scale):
    """Scores in the input dtype (bf16 on GPU), masked fp32 softmax and logsumexp, then p in bf16 times the latent.

    Eager and unfused on purpose: this is the code a kernel has to beat, not a tuned competitor.
    """
    n = kv_cache.shape[1]
    scores = torch.matmul(q, kv_cache.transpose(1, 2)).float() * sm_scale
    pad = torch.arange(n, device=q.device)[None, :] >= cache_seqlens[:, None]
    scores = scores.masked_fill(pad[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.softmax(scores, dim=-1).to(q.dtype)
    o = torch.matmul(p, kv_cache[..., :D_LATENT])
    return o, lse
