"""Must give incorrect: skips the max subtraction, so exp() overflows on the offset (+1000) inputs of seed 1."""
import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < cols
    x = tl.load(x_ptr + row * stride + col, mask=mask, other=-float("inf"))
    e = tl.exp(x)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * stride + col, y, mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    rows, cols = x.shape
    _kernel[(rows,)](x, y, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols))
    return y
