"""Must give forbidden naming line 3 (time is off the import allowlist); with static checks off, the worker's
timer-identity check names time.perf_counter (HARNESS.md H1)."""
import time

import torch

time.perf_counter = lambda: 0.0


def forward(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x)
