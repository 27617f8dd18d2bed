"""Must give incorrect: returns an unwritten torch.empty, hoping for a stale reference output (HARNESS.md C1)."""
import torch


def forward(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)
