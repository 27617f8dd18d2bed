"""Must give incorrect: returns a torch.Tensor subclass, not exactly torch.Tensor (HARNESS.md C3)."""
import torch


class Lazy(torch.Tensor):
    pass


def forward(x: torch.Tensor) -> torch.Tensor:
    return torch.full_like(x, 1.0 / x.shape[-1]).as_subclass(Lazy)
