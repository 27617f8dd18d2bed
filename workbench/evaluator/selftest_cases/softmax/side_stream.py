"""Must give forbidden naming line 21 (torch.cuda.Stream is banned). With static checks off, on a GPU, the kernel
runs on a side stream, outside the timed window (HARNESS.md T1): the profiler's stream check, the spot checks or
the roofline floor reject it."""
import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < cols
    x = tl.load(x_ptr + row * stride + col, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + col, e / tl.sum(e, axis=0), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    side = torch.cuda.Stream()
    rows, cols = x.shape
    with torch.cuda.stream(side):
        _kernel[(rows,)](x, y, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols))
    return y
