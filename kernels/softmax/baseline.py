"""Baseline for row softmax: PyTorch's own torch.softmax (runs only in the trusted process)."""

from __future__ import annotations

import torch

NAME = "torch.softmax"
"""What speedups are measured against."""


def available() -> bool:
    """torch.softmax exists wherever torch does."""
    return True


def forward(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim, in x's dtype."""
    return torch.softmax(x, dim=-1)
