"""Must give forbidden naming line 8: an attention library call (scaled_dot_product_attention) does the work."""
import torch
import torch.nn.functional as F


def forward(x: torch.Tensor) -> torch.Tensor:
    q = torch.zeros(1, 1, x.shape[0], 1, dtype=x.dtype, device=x.device)
    return F.scaled_dot_product_attention(q, q, x[None, None, :, :, None].squeeze(-1))
