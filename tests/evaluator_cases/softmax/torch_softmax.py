"""Must give forbidden naming line 7: the baseline op itself instead of a kernel."""
import torch
import torch.nn.functional as F


def forward(x: torch.Tensor) -> torch.Tensor:
    return F.softmax(x, dim=-1)
