"""Must give incorrect: returns its input unchanged (an identity "kernel", HARNESS.md C7)."""
import torch


def forward(x: torch.Tensor) -> torch.Tensor:
    return x
