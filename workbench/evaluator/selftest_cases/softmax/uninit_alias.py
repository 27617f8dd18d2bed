"""Must give incorrect: computes the first call properly, then returns uninitialised memory, hoping the allocator
hands back the freed output of an earlier call (HARNESS.md C1: the Sakana result-reuse exploit)."""
import torch
import triton
import triton.language as tl

_CALLS = [0]


@triton.jit
def _kernel(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < cols
    x = tl.load(x_ptr + row * stride + col, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + col, e / tl.sum(e, axis=0), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    _CALLS[0] += 1
    y = torch.empty_like(x)
    if _CALLS[0] == 1:
        rows, cols = x.shape
        _kernel[(rows,)](x, y, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols))
    return y
