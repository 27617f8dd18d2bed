"""Must give timeout: forward launches a GPU kernel that never finishes (the GPU hangs, not the host)."""
import torch
import triton
import triton.language as tl


@triton.jit
def _spin(flag, out):
    # Nothing ever writes flag: the volatile load keeps the compiler from folding the loop away.
    while tl.load(flag, volatile=True) == 0:
        pass
    tl.store(out, 1.0)


def forward(x: torch.Tensor) -> torch.Tensor:
    flag = torch.zeros(1, dtype=torch.int32, device=x.device)
    out = torch.empty_like(x)
    _spin[(1,)](flag, out)
    return out
