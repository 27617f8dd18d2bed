"""Must give forbidden: the candidate replaces time.perf_counter (HARNESS.md H1)."""
import time

import torch

time.perf_counter = lambda: 0.0


def forward(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x)
