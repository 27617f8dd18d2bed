"""Check the in-process NVML reader against nvidia-smi on a real GPU, and time both.

Run (repo root, GPU box): PYTHONPATH=. python benchmarks/nvml_check.py [--calls 20] [--load-s 2]

Prints one NVML row beside one envinfo.smi_query() row with per-field agreement, the mean wall and CPU time of
`--calls` reads from each (nvidia-smi's CPU is counted in its child processes), and, when torch sees a GPU, a
ClockSampler summary from each source taken under a matmul load so the clocks are not idle. Writes the same as
JSON to $OUT/nvml_check.json when OUT is set. Exit 1 when NVML gives no row or disagrees on which fields exist.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from workbench.evaluator import envinfo, nvml

KEYS = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw", "throttle.active")
"""The fields ClockSampler.stop() summarises: the ones both sources must provide in the same form."""


def _timed(fn, calls: int) -> dict[str, Any]:
    walls = []
    # process_time has sub-ms resolution for our own CPU; os.times (10 ms ticks) is the only view of the children's.
    own, children = time.process_time(), os.times()
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        walls.append((time.perf_counter() - start) * 1e3)
    after = os.times()
    cpu = (time.process_time() - own + after.children_user + after.children_system
           - children.children_user - children.children_system)
    return {"calls": calls, "mean_ms": statistics.fmean(walls), "median_ms": statistics.median(walls),
            "max_ms": max(walls), "cpu_ms_per_call": cpu * 1e3 / calls}


def _agreement(ours: dict[str, str], smi: dict[str, Any]) -> dict[str, str]:
    """Per field: both values, and whether they are close enough for a sample taken a few ms apart."""
    out = {}
    for key in KEYS:
        a, b = ours.get(key), smi.get(key)
        if a is None or b is None:
            verdict = "missing in " + ("both" if a is None and b is None else "nvml" if a is None else "smi")
        elif key == "throttle.active":
            verdict = "same" if int(a, 16) == int(str(b), 16) else "differs"
        else:
            try:
                gap = abs(float(a) - float(b))
            except ValueError:
                verdict = "unparsable"
            else:
                # Power is a moving 1 s average and clocks can step between two reads; temperature drifts by 1 C.
                slack = {"power.draw": 25.0, "temperature.gpu": 2.0}.get(key, 0.0)
                verdict = "same" if gap == 0 else ("close" if gap <= slack else f"differs by {gap:g}")
        out[key] = f"nvml={a!s:<20} smi={b!s:<20} {verdict}"
    return out


def _sampler_under_load(seconds: float, force_smi: bool) -> dict[str, Any] | None:
    """A ClockSampler summary (0.1 s interval) while bf16 matmuls keep the GPU busy; None without a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    real_query = nvml.query
    if force_smi:
        nvml.query = lambda target=None: None  # the fallback path, exactly as the harness would take it
    try:
        sampler = envinfo.ClockSampler(interval_s=0.1)
        sampler.start()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(8):
                a @ a
            torch.cuda.synchronize()
        return sampler.stop()
    finally:
        nvml.query = real_query


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--load-s", type=float, default=2.0)
    args = parser.parse_args()

    start = time.perf_counter()
    reader = nvml.reader()
    open_ms = (time.perf_counter() - start) * 1e3
    report: dict[str, Any] = {"target": nvml.visible_target(), "nvml_open_ms": open_ms,
                              "nvml_usable": reader is not None}
    print(f"target GPU (CUDA_VISIBLE_DEVICES rule): {report['target']}")
    print(f"NVML open (dlopen + nvmlInit_v2 + handle): {open_ms:.1f} ms, usable: {reader is not None}")

    ours = nvml.query() or {}
    smi = envinfo.smi_query()
    report.update(nvml_row=ours, smi_row={k: smi.get(k) for k in KEYS}, agreement=_agreement(ours, smi))
    print("field            values")
    for key, line in report["agreement"].items():
        print(f"  {key:<16} {line}")

    if reader is not None:
        report["nvml_timing"] = _timed(nvml.query, args.calls)
    report["smi_timing"] = _timed(envinfo.smi_query, args.calls) if smi else None
    for name in ("nvml_timing", "smi_timing"):
        t = report.get(name)
        if t:
            print(f"{name:<12} mean {t['mean_ms']:.3f} ms  median {t['median_ms']:.3f} ms  max {t['max_ms']:.3f} ms  "
                  f"cpu {t['cpu_ms_per_call']:.3f} ms/call  ({t['calls']} calls)")

    for source, force_smi in (("nvml", False), ("nvidia-smi", True)):
        summary = _sampler_under_load(args.load_s, force_smi)
        report[f"sampler_{source}"] = summary
        if summary is not None:
            print(f"sampler, {source} wanted: {json.dumps(summary)}")
    report["threads_left"] = [t.name for t in threading.enumerate() if t.name == "clock-sampler"]

    out = os.environ.get("OUT")
    if out:
        Path(out, "nvml_check.json").write_text(json.dumps(report, indent=2))
    if not ours:
        print("FAIL: NVML gave no row; the sampler would fall back to nvidia-smi", file=sys.stderr)
        return 1
    missing = [k for k in KEYS if (k in ours) != (k in smi)]
    if missing:
        print(f"FAIL: fields present in only one source: {', '.join(missing)}", file=sys.stderr)
        return 1
    print("OK: NVML row has the sampler's fields in nvidia-smi's form")
    return 0


if __name__ == "__main__":
    sys.exit(main())
