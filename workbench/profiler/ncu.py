"""Nsight Compute on request: run ncu over one shape of a candidate with a curated metric set, parse its CSV.

ncu runs with ``--clock-control none`` (the GPU's clocks are left as they are, METHOD.md) and
``--profile-from-start off``: drive.py compiles and warms up first, then brackets the profiled calls with
cudaProfilerStart/Stop, so only those launches are replayed. Parsing is a pure function over the CSV text, so it
is tested with recorded output on machines without a GPU.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from workbench.evaluator import isolation, tether

METRICS: dict[str, str] = {
    "duration_ns": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "registers": "launch__registers_per_thread",
    "smem_static": "launch__shared_mem_per_block_static",
    "smem_dynamic": "launch__shared_mem_per_block_dynamic",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    "waves": "launch__waves_per_multiprocessor",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "l2_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_bytes": "lts__t_bytes.sum",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "local_ld": "smsp__sass_inst_executed_op_local_ld.sum",
    "local_st": "smsp__sass_inst_executed_op_local_st.sum",
    "fadd": "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "fmul": "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "ffma": "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "hadd": "smsp__sass_thread_inst_executed_op_hadd_pred_on.sum",
    "hmul": "smsp__sass_thread_inst_executed_op_hmul_pred_on.sum",
    "hfma": "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum",
    "dadd": "smsp__sass_thread_inst_executed_op_dadd_pred_on.sum",
    "dmul": "smsp__sass_thread_inst_executed_op_dmul_pred_on.sum",
    "dfma": "smsp__sass_thread_inst_executed_op_dfma_pred_on.sum",
}
"""Short name -> ncu metric: throughput, occupancy, launch resources, L2, DRAM bytes, spills, FP instructions."""

STALL_REASONS = ("long_scoreboard", "short_scoreboard", "barrier", "membar", "mio_throttle", "lg_throttle",
                 "math_pipe_throttle", "wait", "not_selected", "no_instruction", "dispatch_stall", "drain",
                 "imc_miss", "branch_resolving", "sleeping", "tex_throttle", "misc")
"""Warp stall reasons, each read as average cycles stalled per issued instruction."""

for _reason in STALL_REASONS:
    METRICS[f"stall_{_reason}"] = f"smsp__average_warps_issue_stalled_{_reason}_per_issue_active.ratio"

_BY_METRIC = {v: k for k, v in METRICS.items()}


class NcuError(Exception):
    """ncu is missing, not permitted, or produced nothing usable; the message is one line a person can act on."""


def _number(text: str) -> float | None:
    text = (text or "").strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_csv(text: str) -> list[dict[str, Any]]:
    """Parse ncu's CSV (details page, one row per metric; or raw page, one row per launch) into launch rows.

    Returns:
        [{"id", "kernel", "stream", "grid_text", "block_text", "metrics": {short_name: float}}] in launch order;
        metrics not in METRICS keep their ncu name.

    Raises:
        NcuError: no CSV header in the text.
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise NcuError("ncu printed no CSV table (no kernel was profiled?)")
    reader = csv.DictReader(io.StringIO("\n".join(ln for ln in lines[start:] if not ln.startswith("=="))))
    fields = reader.fieldnames or []
    launches: dict[str, dict[str, Any]] = {}
    if "Metric Name" in fields:
        for row in reader:
            launch = launches.setdefault(row["ID"], _launch(row))
            name = row.get("Metric Name", "")
            value = _number(row.get("Metric Value", ""))
            if value is not None:
                launch["metrics"][_BY_METRIC.get(name, name)] = value
    else:
        for row in reader:
            if not (row.get("ID") or "").strip():
                continue  # the units row under the header of the raw page
            launch = launches.setdefault(row["ID"], _launch(row))
            for name, text in row.items():
                if name in _BY_METRIC or "__" in (name or ""):
                    value = _number(text)
                    if value is not None:
                        launch["metrics"][_BY_METRIC.get(name, name)] = value
    return [launches[k] for k in sorted(launches, key=lambda k: int(k) if k.isdigit() else 0)]


def _launch(row: dict[str, str]) -> dict[str, Any]:
    return {"id": row.get("ID"), "kernel": row.get("Kernel Name") or row.get("Function Name") or "?",
            "stream": row.get("Stream"), "grid_text": row.get("Grid Size"), "block_text": row.get("Block Size"),
            "metrics": {}}


def derive(metrics: dict[str, float]) -> dict[str, Any]:
    """Add derived values: shared memory per block, FLOPs and FLOP/s, DRAM and L2 bytes/s, the top warp stalls."""
    m: dict[str, Any] = dict(metrics)
    if "smem_static" in m or "smem_dynamic" in m:
        m["smem_per_block"] = (m.get("smem_static") or 0) + (m.get("smem_dynamic") or 0)
    flops = 0.0
    seen = False
    for prefix in ("f", "h", "d"):
        for op, weight in (("add", 1), ("mul", 1), ("fma", 2)):
            value = m.get(f"{prefix}{op}")
            if value is not None:
                flops += weight * value
                seen = True
    duration = m.get("duration_ns")
    if seen:
        m["flops"] = flops
        if duration:
            m["flop_s"] = flops / (duration * 1e-9)
    moved = [m.get("dram_read_bytes"), m.get("dram_write_bytes")]
    if all(v is not None for v in moved) and duration:
        m["bytes_per_s"] = (moved[0] + moved[1]) / (duration * 1e-9)
    if m.get("l2_bytes") is not None and duration:
        # Everything the L2 served or took in: a kernel that round-trips data through L2 (split-K partials, a
        # reduction between its own stages) shows here while its DRAM figure looks idle.
        m["l2_bytes_per_s"] = m["l2_bytes"] / (duration * 1e-9)
    stalls = [{"reason": r, "cycles": m[f"stall_{r}"]} for r in STALL_REASONS if m.get(f"stall_{r}") is not None]
    m["stall_top"] = sorted(stalls, key=lambda s: -s["cycles"])[:3]
    return m


def summarize(launches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per kernel name: metrics averaged over its launches, then derived values."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for launch in launches:
        grouped.setdefault(launch["kernel"], []).append(launch)
    rows = []
    for kernel, group in grouped.items():
        keys = {k for g in group for k in g["metrics"]}
        avg = {}
        for k in keys:
            values = [g["metrics"][k] for g in group if k in g["metrics"]]
            avg[k] = sum(values) / len(values)
        rows.append({"kernel": kernel, "launches": len(group), "metrics": derive(avg)})
    return sorted(rows, key=lambda r: -(r["metrics"].get("duration_ns") or 0))


_PERMISSION = ("ERR_NVGPUCTRPERM", "permission to access NVIDIA GPU Performance Counters")
_UNAVAILABLE = ("Failed to initialize the profiler", "LibraryNotLoaded", "Device not supported",
                "profiling is not supported")
_UNKNOWN_METRIC = re.compile(r"Failed to find metric\s+(?:regex:)?([A-Za-z0-9_.]+)")


def explain_failure(output: str, returncode: int) -> str:
    """One line saying why an ncu run produced no metrics."""
    if any(p in output for p in _PERMISSION):
        return ("ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM); an administrator must "
                "allow profiling (NVreg_RestrictProfilingToAdminUsers=0) or run as root")
    for marker in _UNAVAILABLE:
        if marker in output:
            return f"ncu cannot profile on this machine ({marker}); use the evaluator's kernel table instead"
    if "No kernels were profiled" in output:
        return "ncu profiled no kernels: the candidate launched nothing between cudaProfilerStart and Stop"
    tail = [ln.strip() for ln in output.splitlines() if ln.strip().startswith("==ERROR==")]
    if tail:
        return f"ncu failed: {tail[0][:200]}"
    return f"ncu exited with status {returncode} and no metrics"


def command(ncu: str, task: str, file: str, shape: str, metrics: list[str], log: str, calls: int) -> list[str]:
    """The ncu command line over drive.py for one shape."""
    return [ncu, "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
            "--csv", "--print-units", "base", "--log-file", log, "--metrics", ",".join(metrics),
            sys.executable, "-m", "workbench.profiler.drive", "--task", task, "--file", file, "--shape", shape,
            "--calls", str(calls)]


def run(task: str, file: str | Path, shape: str, *, calls: int = 1, timeout_s: float = 300.0,
        ncu: str | None = None, metrics: list[str] | None = None, gpu: str | None = None) -> dict[str, Any]:
    """Profile one shape of a candidate under ncu.

    Args:
        task: task name; file: candidate file; shape: a shape name of the task (its CUDA group).
        calls: profiled calls after the warm-up (each kernel launch is replayed once per metric pass).
        timeout_s: wall-clock limit for the whole ncu run.
        ncu: path to the ncu binary (default: found on PATH or in /usr/local/cuda/bin).
        metrics: ncu metric names (default: METRICS).
        gpu: the GPU to profile on, as CUDA_VISIBLE_DEVICES takes it (a slot's); None keeps this process's.

    Returns:
        {"shape", "rows": summarize(...), "launches": n, "command": "...", "dropped": [metric, ...],
         "csv": raw text}.

    Raises:
        NcuError: ncu missing, not permitted, failed, or profiled nothing (one line).
    """
    exe = ncu or shutil.which("ncu") or next((p for p in ("/usr/local/cuda/bin/ncu",) if os.path.exists(p)), None)
    if exe is None:
        raise NcuError("ncu (Nsight Compute) is not installed or not on PATH; profile without --ncu")
    wanted = list(metrics or METRICS.values())
    dropped: list[str] = []
    env = isolation.candidate_env("cuda", gpu=gpu)  # drive.py runs the candidate: what a candidate process gets
    with tempfile.TemporaryDirectory(prefix="workbench-ncu-") as tmp:
        log = os.path.join(tmp, "ncu.csv")
        for _ in range(3):  # an ncu version without some metric names: drop them and retry
            cmd = command(exe, task, str(Path(file).absolute()), shape, wanted, log, calls)
            try:
                proc = subprocess.run(tether.command_argv(cmd), capture_output=True, text=True, timeout=timeout_s,
                                      env=env)
            except subprocess.TimeoutExpired:
                raise NcuError(f"ncu did not finish within {timeout_s:g} s") from None
            except OSError as exc:
                raise NcuError(f"ncu could not start: {exc}") from None
            text = Path(log).read_text(errors="replace") if os.path.exists(log) else ""
            output = proc.stdout + proc.stderr + text
            unknown = [m for m in _UNKNOWN_METRIC.findall(output) if m in wanted]
            if unknown:
                dropped += unknown
                wanted = [m for m in wanted if m not in unknown]
                continue
            if proc.returncode != 0 and '"ID"' not in text:
                raise NcuError(explain_failure(output, proc.returncode))
            try:
                launches = parse_csv(text)
            except NcuError:
                raise NcuError(explain_failure(output, proc.returncode)) from None
            if not launches:
                raise NcuError(explain_failure(output, proc.returncode))
            return {"shape": shape, "rows": summarize(launches), "launches": len(launches),
                    "command": " ".join(cmd), "dropped": dropped, "csv": text}
    raise NcuError(f"ncu rejected metric names repeatedly ({', '.join(dropped[:3])}...)")


_RESOURCE_PARTS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("registers", lambda m: f"{m['registers']:.0f} regs/thread"),
    ("smem_per_block", lambda m: f"{m['smem_per_block'] / 1024:.1f} KiB smem/block"),
    ("grid", lambda m: f"grid {m['grid']:.0f} x block {m.get('block', 0):.0f}"),
    ("bytes_per_s", lambda m: f"{m['bytes_per_s'] / 1e12:.2f} TB/s"),
    ("l2_bytes_per_s", lambda m: f"L2 {m['l2_bytes_per_s'] / 1e12:.2f} TB/s"),
    ("flop_s", lambda m: f"{m['flop_s'] / 1e12:.2f} TFLOP/s (non-tensor)"),
]
"""The second line of a kernel's block: each metric present, in this order."""


def format_rows(rows: list[dict[str, Any]], indent: str = "  ") -> list[str]:
    """Text lines: one block per kernel with the curated metrics people read first."""
    lines = []
    for row in rows:
        m = row["metrics"]

        def pct(key: str) -> str:
            return f"{m[key]:.0f}%" if m.get(key) is not None else "-"

        dur = f"{m['duration_ns'] / 1e3:.1f} us" if m.get("duration_ns") is not None else "-"
        lines.append(f"{indent}{row['kernel']} (x{row['launches']}): {dur}, DRAM {pct('dram_pct')}, "
                     f"SM {pct('sm_pct')}, occupancy {pct('occupancy_pct')} (theoretical "
                     f"{pct('theoretical_occupancy_pct')}), L2 {pct('l2_pct')} (hit {pct('l2_hit_pct')})")
        parts = [fmt(m) for key, fmt in _RESOURCE_PARTS if m.get(key) is not None]
        if parts:
            lines.append(f"{indent}  " + ", ".join(parts))
        if m.get("stall_top"):
            lines.append(f"{indent}  stalls (cycles/issue): " +
                         ", ".join(f"{s['reason']} {s['cycles']:.2f}" for s in m["stall_top"]))
    return lines
