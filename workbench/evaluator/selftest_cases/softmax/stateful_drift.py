"""Must give incorrect: right for the first 16 calls (every checked call), then skips the max subtraction, so
exp() overflows on large logits (HARNESS.md C10). Only the timed-call spot checks and the re-validation see it."""
import torch
import triton
import triton.language as tl

_CALLS = [0]


@triton.jit
def _kernel(x_ptr, y_ptr, cols, stride, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < cols
    x = tl.load(x_ptr + row * stride + col, mask=mask, other=-float("inf"))
    if SHIFT:
        x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(y_ptr + row * stride + col, e / tl.sum(e, axis=0), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    _CALLS[0] += 1
    y = torch.empty_like(x)
    rows, cols = x.shape
    _kernel[(rows,)](x, y, cols, x.stride(0), SHIFT=_CALLS[0] <= 16, BLOCK=triton.next_power_of_2(cols))
    return y
