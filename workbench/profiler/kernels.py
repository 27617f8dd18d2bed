"""The kernel table from profiler events: which GPU work each profiled call did, how long it took, who owns it.

Events arrive as plain dicts (capture.py turns torch.profiler's records into them; tests feed recorded fixtures):
``{"name", "device": "cuda" | "cpu", "kind": "kernel" | "memcpy" | "memset" | "annotation", "start_ns",
"dur_ns", "stream", "grid", "block"}``. Each profiled call runs inside a CPU-side annotation window named
``wb::call<i>`` that starts after a device-wide sync and ends after another, so every GPU activity that starts
inside a window belongs to that call, whatever stream it ran on.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

WINDOW_PREFIX = "wb::call"
"""Name prefix of the annotation that brackets one profiled call."""

HOUSEKEEPING = re.compile(r"FillFunctor|direct_copy_kernel|copy_kernel|CopyFunctor")
"""aten kernels that only initialise or copy memory (zero_, fill_, copy_, .to()): allowed beside a candidate's own
kernels, as the dispatch check allows the ops behind them."""


def windows(events: Iterable[dict[str, Any]]) -> list[tuple[int, int]]:
    """The (start_ns, end_ns) of every call window, in call order."""
    found = []
    for e in events:
        name = str(e.get("name", ""))
        if e.get("device") == "cpu" and name.startswith(WINDOW_PREFIX):
            try:
                index = int(name[len(WINDOW_PREFIX):])
            except ValueError:
                continue
            found.append((index, int(e["start_ns"]), int(e["start_ns"]) + int(e["dur_ns"])))
    return [(s, t) for _, s, t in sorted(found)]


def attribute(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """GPU activities grouped by the call window they started in (one list per window, in order).

    Activities outside every window (the evaluator's own refill and flush between calls) are dropped. The first
    activity of a window, when it is a memcpy, is the evaluator's marker copy (issued on the caller's stream right
    before the call): it is flagged ``marker`` and left out of tables and sums.
    """
    spans = windows(events)
    calls: list[list[dict[str, Any]]] = [[] for _ in spans]
    for e in events:
        if e.get("device") != "cuda" or e.get("kind") == "annotation":
            continue
        start = int(e["start_ns"])
        for i, (lo, hi) in enumerate(spans):
            if lo <= start <= hi:
                calls[i].append(e)
                break
    for call in calls:
        call.sort(key=lambda e: int(e["start_ns"]))
        if call and call[0].get("kind") == "memcpy":
            call[0] = {**call[0], "marker": True}
    return calls


def per_call_ms(calls: list[list[dict[str, Any]]], *, kernels_only: bool = False) -> list[float]:
    """GPU busy time of each call: the sum of its activities' durations, in ms (an independent timer)."""
    out = []
    for call in calls:
        total = sum(int(e["dur_ns"]) for e in call
                    if not e.get("marker") and (not kernels_only or e.get("kind") == "kernel"))
        out.append(total / 1e6)
    return out


def kernel_table(calls: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per distinct kernel or memory operation over all calls: name, calls, total/mean ms, share.

    Rows are sorted by total time, largest first; share is the fraction of all GPU time in the profiled calls.
    """
    rows: dict[str, dict[str, Any]] = {}
    for call in calls:
        for e in call:
            if e.get("marker"):
                continue
            row = rows.setdefault(e["name"], {"name": e["name"], "kind": e.get("kind", "kernel"), "calls": 0,
                                              "total_ms": 0.0, "grid": e.get("grid"), "block": e.get("block"),
                                              "streams": set()})
            row["calls"] += 1
            row["total_ms"] += int(e["dur_ns"]) / 1e6
            if e.get("stream") is not None:
                row["streams"].add(e["stream"])
    total = sum(r["total_ms"] for r in rows.values())
    out = []
    for row in sorted(rows.values(), key=lambda r: -r["total_ms"]):
        row["mean_ms"] = row["total_ms"] / row["calls"]
        row["share"] = row["total_ms"] / total if total > 0 else 0.0
        row["streams"] = sorted(row["streams"])
        out.append(row)
    return out


def owned(kernel: str, jit_names: Iterable[str]) -> bool:
    """Whether a GPU kernel name is one of the candidate's Triton kernels (Triton names a kernel after its function;
    a specialisation suffix after an underscore is tolerated)."""
    return any(kernel == name or kernel.startswith(name + "_") for name in jit_names)


def provenance(calls: list[list[dict[str, Any]]], jit_names: Iterable[str]) -> list[str]:
    """Problems with who did the work, one line each (HARNESS.md L1, T1).

    Every kernel must be a Triton kernel named after one of the candidate's @triton.jit functions, or memory
    housekeeping (memset, memcpy, fill, copy); every activity of a call must run on the stream the call was made
    on (the stream of the evaluator's marker copy).
    """
    allowed = set(jit_names)
    problems: list[str] = []
    foreign: dict[str, int] = {}
    for call in calls:
        for e in call:
            kind = e.get("kind", "kernel")
            if kind in ("memcpy", "memset") or e.get("marker"):
                continue
            name = str(e["name"])
            if owned(name, allowed) or HOUSEKEEPING.search(name):
                continue
            foreign[name] = foreign.get(name, 0) + 1
    if foreign:
        names = ", ".join(f"{_short(n)} (x{c})" for n, c in sorted(foreign.items(), key=lambda kv: -kv[1])[:3])
        problems.append(f"forward launched GPU kernels that are not the candidate's Triton kernels "
                        f"({', '.join(sorted(allowed)) or 'none defined'}): {names}")
    for i, call in enumerate(calls):
        marker = next((e for e in call if e.get("marker")), None)
        if marker is None or marker.get("stream") is None:
            continue
        others = sorted({e.get("stream") for e in call if e.get("stream") not in (None, marker["stream"])})
        if others:
            problems.append(f"forward ran GPU work on stream(s) {others} besides the caller's stream "
                            f"{marker['stream']} (call {i}): work on another stream escapes the timed window")
            break
    return problems


def _short(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def format_table(rows: list[dict[str, Any]], indent: str = "  ") -> list[str]:
    """Text lines of a kernel table (name, calls, total, mean, share)."""
    if not rows:
        return [f"{indent}(no GPU activity recorded)"]
    header = ["kernel", "calls", "total_ms", "mean_ms", "share"]
    body = [[_short(str(r["name"])), str(r["calls"]), f"{r['total_ms']:.4f}", f"{r['mean_ms']:.4f}",
             f"{100 * r['share']:.1f}%"] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    lines = [indent + "  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += [indent + "  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    return lines
