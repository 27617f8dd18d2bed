"""Must give incorrect on a held-out shape: a correct kernel for exactly the public shapes, zeros for any other
(HARNESS.md C12). Only the held-out shapes, which the agent never sees, catch it."""
import torch
import triton
import triton.language as tl

PUBLIC = {(4096, 4096), (8192, 1024), (32768, 512), (1024, 32768), (1, 1), (7, 129), (33, 1000), (16, 7), (3, 5000)}


@triton.jit
def _kernel(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < cols
    x = tl.load(x_ptr + row * stride + col, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + col, e / tl.sum(e, axis=0), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    rows, cols = x.shape
    if (rows, cols) not in PUBLIC:
        return torch.zeros_like(x)
    y = torch.empty_like(x)
    _kernel[(rows,)](x, y, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols))
    return y
