"""Must give forbidden: defers the kernel to a background thread and returns an unwritten output (HARNESS.md T2).
Static check: forbidden naming line 22 (import threading). With static checks off, the run-time thread check
catches the thread still running when forward returns (function-local imports raise no audit event)."""
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
    rows, cols = x.shape
    import threading
    import time

    def later():
        time.sleep(0.5)
        _kernel[(rows,)](x, y, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols))

    threading.Thread(target=later, daemon=True).start()
    return y
