"""Must give incorrect (spot check of a timed call): caches each output keyed on the input's address, so repeated
calls on the same buffer return the first result without running the kernel (HARNESS.md C9). Correctness calls
see fresh tensors and pass; the timed calls refill the same buffer with other inputs and catch it."""
import torch
import triton
import triton.language as tl

_CACHE = {}


@triton.jit
def _kernel(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < cols
    x = tl.load(x_ptr + row * stride + col, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + col, e / tl.sum(e, axis=0), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    key = (x.data_ptr(), tuple(x.shape))
    if key in _CACHE:
        return _CACHE[key]
    y = torch.empty_like(x)
    rows, cols = x.shape
    _kernel[(rows,)](x, y, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols))
    _CACHE[key] = y
    return y
