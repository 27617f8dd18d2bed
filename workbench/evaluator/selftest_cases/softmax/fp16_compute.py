"""Must give incorrect: computes in fp16 and returns fp32 (a precision downcast, HARNESS.md L2): its error, about
1e-4, is far above the task's 1e-5 tolerance and the baseline's fp32 error."""
import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < cols
    x = tl.load(x_ptr + row * stride + col, mask=mask, other=-float("inf"))
    shifted = (x - tl.max(x, axis=0)).to(tl.float16)
    e = tl.exp(shifted.to(tl.float32)).to(tl.float16)
    y = e.to(tl.float32) / tl.sum(e.to(tl.float32), axis=0)
    tl.store(y_ptr + row * stride + col, y.to(tl.float16).to(tl.float32), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    rows, cols = x.shape
    _kernel[(rows,)](x, y, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols))
    return y
