"""Must give forbidden naming line 6: a lazy Tensor subclass that computes only when the checker looks at it
(HARNESS.md C3). With static checks off, the exact-type check makes it incorrect."""
import torch


class Lazy(torch.Tensor):
    pass


def forward(x: torch.Tensor) -> torch.Tensor:
    return torch.full_like(x, 1.0 / x.shape[-1]).as_subclass(Lazy)
