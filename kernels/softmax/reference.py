"""Trusted oracle for row softmax: adversarial fp32 inputs and an fp64 reference."""

from __future__ import annotations

import torch

DISTRIBUTIONS = ("normal", "offset", "heavy")
"""Input families, chosen by seed: seed 0 plain logits, seed 1 a large common offset, seed 2 heavy tails."""


def make_inputs(shape: dict, seed: int, device: str) -> dict[str, torch.Tensor]:
    """Fresh fp32 logits x[rows, cols], deterministic in (shape, seed, device).

    The distributions are chosen so shortcuts fail: "offset" adds 1000 to every logit, so a kernel that skips
    the max subtraction overflows exp() in fp32; "heavy" mixes per-row offsets of +-500, per-row scales spread
    over three orders of magnitude and one dominant spike per row, so near-uniform or near-one-hot guesses fail
    and row bookkeeping errors show.
    """
    rows, cols = int(shape["rows"]), int(shape["cols"])
    gen = torch.Generator(device=device)
    gen.manual_seed(1_000_003 * seed + 7919 * rows + cols)
    kind = DISTRIBUTIONS[seed % len(DISTRIBUTIONS)]
    x = torch.randn(rows, cols, generator=gen, device=device, dtype=torch.float32)
    if kind == "normal":
        x = 2.0 * x
    elif kind == "offset":
        x = 1000.0 + 8.0 * x
    else:
        offset = (torch.rand(rows, 1, generator=gen, device=device) - 0.5) * 1000.0
        scale = torch.exp((torch.rand(rows, 1, generator=gen, device=device) - 0.5) * 7.0)
        x = offset + scale * x
        spike = torch.randint(0, cols, (rows, 1), generator=gen, device=device)
        x.scatter_add_(1, spike, torch.full((rows, 1), 6.0, device=device))
    return {"x": x.contiguous()}


def forward(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim, computed in fp64 from the fp32 input (returned in fp64)."""
    x64 = x.to(torch.float64)
    shifted = x64 - x64.amax(dim=-1, keepdim=True)
    e = torch.exp(shifted)
    return e / e.sum(dim=-1, keepdim=True)
