"""Must give forbidden naming line 5: a kernel library import."""
import torch
import triton

import flash_attn


def forward(x: torch.Tensor) -> torch.Tensor:
    return x
