"""Seed kernel for row softmax: one program per block of rows; one pass when a row fits a tile, else an online loop."""

import torch
import triton
import triton.language as tl

TUNABLES = {
    "BLOCK_ROWS": [1, 2, 4, 8],
    "num_warps": [1, 2, 4, 8, 16],
    "SINGLE_PASS_MAX": [2048, 4096, 8192, 16384, 32768],
    "LOOP_BLOCK": [1024, 2048, 4096],
}
CONFIG = {"BLOCK_ROWS": 1, "num_warps": 4, "SINGLE_PASS_MAX": 4096, "LOOP_BLOCK": 2048}

TILE_MAX = 32768
"""Most elements one program holds at once; wider row blocks would only spill registers."""


@triton.jit
def _softmax_tile(x_ptr, y_ptr, rows, cols, stride_x, stride_y,
                  BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = row < rows
    # Rows past the end read the last real row, so no lane ever sees an all -inf row (whose max gives NaN).
    src_row = tl.minimum(row, rows - 1).to(tl.int64)
    col = tl.arange(0, BLOCK_COLS)
    col_ok = col < cols
    x = tl.load(x_ptr + src_row[:, None] * stride_x + col[None, :], mask=col_ok[None, :], other=-float("inf"))
    m = tl.max(x, axis=1)
    e = tl.exp(x - m[:, None])
    s = tl.sum(e, axis=1)
    y = e / s[:, None]
    dst = y_ptr + row.to(tl.int64)[:, None] * stride_y + col[None, :]
    tl.store(dst, y, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _softmax_loop(x_ptr, y_ptr, rows, cols, stride_x, stride_y,
                  BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = row < rows
    src_row = tl.minimum(row, rows - 1).to(tl.int64)
    x_row = x_ptr + src_row[:, None] * stride_x
    # Online pass: running max and the sum of exp relative to it, rescaled whenever the max grows.
    m = tl.full([BLOCK_ROWS], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK_ROWS], tl.float32)
    for start in range(0, cols, BLOCK_COLS):
        col = start + tl.arange(0, BLOCK_COLS)
        x = tl.load(x_row + col[None, :], mask=(col < cols)[None, :], other=-float("inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
    y_row = y_ptr + row.to(tl.int64)[:, None] * stride_y
    for start in range(0, cols, BLOCK_COLS):
        col = start + tl.arange(0, BLOCK_COLS)
        col_ok = col < cols
        x = tl.load(x_row + col[None, :], mask=col_ok[None, :], other=-float("inf"))
        y = tl.exp(x - m[:, None]) / s[:, None]
        tl.store(y_row + col[None, :], y, mask=row_ok[:, None] & col_ok[None, :])


def forward(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of a 2-D fp32 tensor."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, cols = x.shape
    y = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    if rows == 0 or cols == 0:
        return y
    block_cols = triton.next_power_of_2(cols)
    if block_cols <= CONFIG["SINGLE_PASS_MAX"]:
        kernel, tile_cols = _softmax_tile, block_cols
    else:
        kernel, tile_cols = _softmax_loop, CONFIG["LOOP_BLOCK"]
    block_rows = max(1, min(CONFIG["BLOCK_ROWS"], TILE_MAX // tile_cols))
    grid = (triton.cdiv(rows, block_rows),)
    kernel[grid](x, y, rows, cols, x.stride(0), y.stride(0),
                 BLOCK_ROWS=block_rows, BLOCK_COLS=tile_cols, num_warps=CONFIG["num_warps"])
    return y
