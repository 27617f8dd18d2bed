"""Record GPU activity of a few calls with torch.profiler, as the plain event dicts kernels.py reads; Triton stats.

Runs inside the evaluator's processes (the worker for the candidate, the harness for the baseline). Each call gets
its own annotation window, opened after a device-wide sync and closed after another, with a tiny marker copy on the
caller's stream first, so kernels.attribute() can tell the call's work from the evaluator's refill and flush and
can name the stream the call was made on.
"""

from __future__ import annotations

import json
from typing import Any, Callable


def _meta(event: Any) -> dict[str, Any]:
    try:
        text = event.metadata_json()
    except (AttributeError, RuntimeError):
        return {}
    if not text:
        return {}
    try:
        value = json.loads("{" + text + "}" if not text.lstrip().startswith("{") else text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _kind(name: str, activity: str) -> str:
    low = f"{activity} {name}".lower()
    if "memcpy" in low:
        return "memcpy"
    if "memset" in low:
        return "memset"
    return "kernel"


def normalize(kineto_events: Any) -> list[dict[str, Any]]:
    """torch's kineto records as plain dicts: GPU activities and the CPU-side call windows only."""
    from workbench.profiler.kernels import WINDOW_PREFIX

    out = []
    for e in kineto_events:
        try:
            name = e.name()
            device = "cuda" if "cuda" in str(e.device_type()).lower() else "cpu"
            start = int(e.start_ns())
            dur = int(e.duration_ns()) if hasattr(e, "duration_ns") else int(e.end_ns()) - start
        except (AttributeError, RuntimeError, TypeError, ValueError):
            continue
        activity = ""
        try:
            activity = str(e.activity_type())
        except (AttributeError, RuntimeError):
            pass
        if device == "cpu":
            if name.startswith(WINDOW_PREFIX):
                out.append({"name": name, "device": "cpu", "kind": "annotation", "start_ns": start, "dur_ns": dur})
            continue
        if name.startswith(WINDOW_PREFIX) or "annotation" in activity.lower():
            continue
        meta = _meta(e)
        stream = meta.get("stream")
        if stream is None:
            try:
                stream = int(e.device_resource_id())
            except (AttributeError, RuntimeError, TypeError, ValueError):
                stream = None
        out.append({"name": name, "device": "cuda", "kind": _kind(name, activity), "start_ns": start, "dur_ns": dur,
                    "stream": stream, "grid": meta.get("grid"), "block": meta.get("block")})
    return out


def capture(calls: list[tuple[Callable[..., Any], dict[str, Any], Callable[[], None] | None]]) -> list[dict[str, Any]]:
    """Run each (fn, kwargs, prepare) once under one torch.profiler session; return the normalised events (CUDA).

    Call i runs in window ``wb::call<i>``; prepare (refill inputs, flush L2), when given, runs before its window.
    One session for all calls: starting the profiler costs far more than the calls it records.
    """
    import torch
    from torch.autograd import profiler as autograd_profiler

    from workbench.profiler.kernels import WINDOW_PREFIX

    src = torch.zeros(16, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    torch.cuda.synchronize()
    with _session() as prof:
        for i, (fn, kwargs, prepare) in enumerate(calls):
            if prepare is not None:
                prepare()
            torch.cuda.synchronize()
            with autograd_profiler.record_function(f"{WINDOW_PREFIX}{i}"):
                dst.copy_(src)
                fn(**kwargs)
                torch.cuda.synchronize()
    results = getattr(prof, "kineto_results", None) or getattr(getattr(prof, "profiler", None), "kineto_results", None)
    return normalize(results.events() if results is not None else [])


def _session() -> Any:
    """A kineto profiler recording CPU annotations and CUDA activity.

    torch.autograd.profiler.profile is what torch.profiler.profile wraps; the wrapper's set-up probes
    hasattr(torch, "_inductor"), which imports inductor and dynamo (seconds, in every evaluation), so the
    wrapper is used only where the direct form is refused.
    """
    from torch.autograd import profiler as autograd_profiler

    try:
        return autograd_profiler.profile(use_cpu=True, use_device="cuda", use_kineto=True)
    except TypeError:
        from torch.profiler import ProfilerActivity, profile

        return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


def triton_stats(namespace: dict[str, Any]) -> list[dict[str, Any]]:
    """Compile stats of every Triton kernel compiled from the given module namespace: registers, spills, smem.

    Reads Triton's per-device kernel cache (the same numbers ptxas reports); a kernel never launched has none.
    """
    found = []
    seen = set()
    for value in list(namespace.values()):
        fn = value
        for _ in range(8):  # unwrap autotune/heuristics wrappers down to the JITFunction
            if hasattr(fn, "device_caches"):
                break
            fn = getattr(fn, "fn", None)
        caches = getattr(fn, "device_caches", None)
        if caches is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        for entry in list(caches.values()):
            kernel_cache = entry[0] if isinstance(entry, tuple) and entry else None
            if not isinstance(kernel_cache, dict):
                continue
            for compiled in list(kernel_cache.values()):
                meta = getattr(compiled, "metadata", None)
                found.append({
                    "kernel": getattr(compiled, "name", getattr(fn, "__name__", "?")),
                    "regs": getattr(compiled, "n_regs", None),
                    "spills": getattr(compiled, "n_spills", None),
                    "shared": getattr(meta, "shared", None),
                    "num_warps": getattr(meta, "num_warps", None),
                    "num_stages": getattr(meta, "num_stages", None),
                })
    return found
