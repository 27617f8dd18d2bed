"""Output checks in the trusted process: exact type, dtype, shape and device, finiteness, then rel-RMS error."""

from __future__ import annotations

import math
from typing import Any

import torch


def rel_rms(ref: torch.Tensor, out: torch.Tensor) -> float:
    """rms(ref - out) / rms(ref), in fp64. NaN when either side has a NaN (and NaN never passes `<= tol`)."""
    ref64 = ref.to(torch.float64)
    diff = ref64 - out.to(device=ref.device, dtype=torch.float64)
    num = torch.linalg.vector_norm(diff).item()
    den = torch.linalg.vector_norm(ref64).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def as_outputs(value: Any) -> list[Any]:
    """A forward's return value as a list of outputs (a bare value is a single output)."""
    if isinstance(value, (tuple, list)):
        return list(value)
    return [value]


def expected_dtypes(reference: Any, inputs: dict[str, Any], ref_outputs: list[torch.Tensor]) -> list[torch.dtype]:
    """The dtypes a candidate must return.

    A reference may define ``output_dtypes(**inputs)``; otherwise each reference output's dtype is expected, except
    that an fp64 output of an upcasting oracle stands for the working precision: the dtype of the first
    floating-point input tensor.
    """
    hook = getattr(reference, "output_dtypes", None)
    if callable(hook):
        return list(hook(**inputs))
    work = next(
        (v.dtype for v in inputs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()), torch.float64
    )
    return [work if t.dtype == torch.float64 else t.dtype for t in ref_outputs]


def check_reference(name: str, ref: torch.Tensor) -> None:
    """Refuse an oracle output that cannot tell right from wrong (empty, all zero, or non-finite).

    Raises:
        RuntimeError: the task's reference is unusable for this shape (a task bug, not a candidate failure).
    """
    if ref.numel() == 0:
        raise RuntimeError(f"reference output {name} is empty")
    if not bool(torch.isfinite(ref).all()):
        raise RuntimeError(f"reference output {name} has NaN/inf")
    if float(torch.linalg.vector_norm(ref.to(torch.float64))) == 0.0:
        raise RuntimeError(f"reference output {name} is all zeros, so any zero output would pass")


def compare(
    outputs: list[Any],
    meta: list[dict[str, Any]],
    expected: list[torch.Tensor],
    dtypes: list[torch.dtype],
    names: list[str],
    tols: list[float],
    device: str,
) -> dict[str, Any]:
    """Check a candidate's outputs against the reference outputs.

    Args:
        outputs: tensors the worker sent (None where it sent none because the value was not a plain tensor).
        meta: what the worker observed about each returned value (type, dtype, shape, device) before copying.
        expected: reference outputs (on the harness device).
        dtypes: expected dtypes, from expected_dtypes().
        names: output names from task.toml.
        tols: tolerance per output.
        device: "cpu" or "cuda", where outputs must live.

    Returns:
        {"ok": bool, "rel_err": {name: float | None}, "problem": str | None}; "problem" names the first failure.
    """
    errs: dict[str, float | None] = {n: None for n in names}
    if len(outputs) != len(names) or len(meta) != len(names):
        got = len(meta)
        return {"ok": False, "rel_err": errs, "problem": f"forward returned {got} value(s), expected {len(names)} ({', '.join(names)})"}
    problem = None
    for i, name in enumerate(names):
        out, info, ref = outputs[i], meta[i], expected[i]
        if info.get("type") != "torch.Tensor" or type(out) is not torch.Tensor:
            problem = problem or f"output {name} is {info.get('type', type(out).__name__)}, expected exactly torch.Tensor"
            continue
        if out.dtype != dtypes[i]:
            problem = problem or f"output {name} has dtype {str(out.dtype).removeprefix('torch.')}, expected {str(dtypes[i]).removeprefix('torch.')}"
            continue
        if tuple(out.shape) != tuple(ref.shape):
            problem = problem or f"output {name} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
            continue
        if str(info.get("device", "")).split(":")[0] != device:
            problem = problem or f"output {name} is on {info.get('device')}, expected {device}"
            continue
        bad = int((~torch.isfinite(out)).sum()) if out.is_floating_point() else 0
        err = rel_rms(ref, out)
        errs[name] = err
        if bad:
            problem = problem or f"output {name} has {bad} NaN/inf value(s) of {out.numel()}"
            continue
        if not err <= tols[i]:
            problem = problem or f"output {name} rel_rms {err:.3g} > tol {tols[i]:.3g}"
    return {"ok": problem is None, "rel_err": errs, "problem": problem}
