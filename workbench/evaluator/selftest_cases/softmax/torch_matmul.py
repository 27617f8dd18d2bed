"""Must give forbidden (run-time dispatch check): exp in Triton, but the row sums by a matmul and the division by
torch. Nothing here names a banned op, so only the record of dispatched aten ops (aten.mm, aten.div) catches it."""
import torch
import triton
import triton.language as tl


@triton.jit
def _exp_rows(x_ptr, e_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < cols
    x = tl.load(x_ptr + row * stride + col, mask=mask, other=-float("inf"))
    tl.store(e_ptr + row * stride + col, tl.exp(x - tl.max(x, axis=0)), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    e = torch.empty_like(x)
    rows, cols = x.shape
    _exp_rows[(rows,)](x, e, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols))
    ones = torch.ones(cols, 1, dtype=x.dtype, device=x.device)
    return e / (e @ ones)
