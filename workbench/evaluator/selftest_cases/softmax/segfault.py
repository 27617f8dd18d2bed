"""Must give crash: the kernel reads 8 TiB past its input. Under the interpreter the process dies by SIGSEGV
(naming line 11); on a GPU it is an illegal memory access, a CUDA fault."""
import torch
import triton
import triton.language as tl


@triton.jit
def _kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    col = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + col + (1 << 40))
    tl.store(y_ptr + col, v)


def forward(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _kernel[(1,)](x, y, BLOCK=16)
    return y
