"""Must give crash naming line 6: forward raises."""
import torch


def forward(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("kernel launch failed on purpose")
