"""Must give incorrect: right shape, but float64 instead of float32."""
import torch


def forward(x: torch.Tensor) -> torch.Tensor:
    return torch.full(x.shape, 1.0 / x.shape[-1], dtype=torch.float64, device=x.device)
