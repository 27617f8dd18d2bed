"""Must give compile_error naming line 5: a missing colon."""
import torch


def forward(x: torch.Tensor) -> torch.Tensor
    return x
