"""Must give incorrect: NaN everywhere, which passes any check written as `err > tol` (HARNESS.md C11)."""
import torch


def forward(x: torch.Tensor) -> torch.Tensor:
    return torch.full_like(x, float("nan"))
