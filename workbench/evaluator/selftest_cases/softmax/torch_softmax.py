"""Must give forbidden naming line 8: the baseline op itself instead of a kernel. With static checks off, the
run-time dispatch check names aten._softmax."""
import torch
import torch.nn.functional as F


def forward(x: torch.Tensor) -> torch.Tensor:
    return F.softmax(x, dim=-1)
