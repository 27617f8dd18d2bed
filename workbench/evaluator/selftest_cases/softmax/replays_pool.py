"""Must give incorrect (spot check of a timed call): answers only inputs it has seen, the way a candidate that
stored the correct outputs of the service's pooled seeds in an earlier evaluation would replay them. Here the
first three inputs of each shape (the pool seeds' correctness calls) are computed and stored; any other input gets
zeros. Correctness passes, and so would timing on pooled inputs: only the fresh inputs the timed calls use catch
it."""
import torch
import triton
import triton.language as tl

_STORED = {}
POOL = 3


@triton.jit
def _kernel(x_ptr, y_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK)
    mask = col < cols
    x = tl.load(x_ptr + row * stride + col, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride + col, e / tl.sum(e, axis=0), mask=mask)


def forward(x: torch.Tensor) -> torch.Tensor:
    flat = x.view(-1)
    key = (tuple(x.shape), float(flat[0]), float(flat[flat.numel() // 2]), float(flat[-1]))
    if key in _STORED:
        return _STORED[key]
    if sum(1 for k in _STORED if k[0] == key[0]) >= POOL:
        return torch.zeros_like(x)
    y = torch.empty_like(x)
    rows, cols = x.shape
    _kernel[(rows,)](x, y, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols))
    _STORED[key] = y
    return y
