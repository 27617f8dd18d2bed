"""Must give incorrect: a constant output (HARNESS.md C7)."""
import torch


def forward(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x)
