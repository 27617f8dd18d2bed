"""Must give compile_error naming line 10: tl.arange needs a power-of-two range."""
import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, y_ptr, cols, stride):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, 100)
    x = tl.load(x_ptr + row * stride + col, mask=col < cols, other=0.0)
    tl.store(y_ptr + row * stride + col, x, mask=col < cols)


def forward(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0))
    return y
