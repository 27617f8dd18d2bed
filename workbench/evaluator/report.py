"""format_result(): the human-readable summary `workbench eval` prints without --json."""

from __future__ import annotations

from typing import Any


def _num(value: Any, fmt: str = "{:.4g}") -> str:
    return "-" if value is None else fmt.format(value)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    graph = any("graph_ms" in r or "baseline_graph_ms" in r for r in rows)
    header = ["shape", "correct", "rel_err", "ms", "±iqr", "baseline_ms", "speedup", "floor_ms"]
    if graph:
        header += ["graph_ms", "base_graph_ms", "graph_speedup"]
    body = []
    for r in rows:
        correct = {True: "yes", False: "NO", None: "-"}[r.get("correct")]
        body.append([
            str(r["name"]), correct, _num(r.get("rel_err"), "{:.2e}"), _num(r.get("ms")), _num(r.get("ms_iqr"), "{:.2g}"),
            _num(r.get("baseline_ms")), _num(r.get("speedup"), "{:.3g}x"), _num(r.get("floor_ms")),
        ])
        if graph:
            body[-1] += [_num(r.get("graph_ms")), _num(r.get("baseline_graph_ms")),
                         _num(r.get("graph_speedup"), "{:.3g}x")]
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["  " + "  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in body]
    problems = [f"  {r['name']}: {r['problem']}" for r in rows if r.get("problem")]
    return lines + problems


def format_result(result: dict[str, Any]) -> str:
    """A multi-line summary of an evaluator result: verdict, per-shape table, speedup, environment, warnings."""
    lines = [
        f"{result.get('task')}  {result.get('file')}  [{result.get('device')}]  sha256 {str(result.get('sha256', ''))[:12]}",
        f"verdict: {result.get('verdict')}" + (f" - {result['message']}" if result.get("message") else ""),
    ]
    if result.get("quarantined"):
        lines.append(f"quarantined: {result.get('quarantine_reason')} (needs review before it can count as best)")
    if result.get("shapes"):
        lines += _table(result["shapes"])
    if result.get("heldout"):
        lines.append("held-out shapes:")
        lines += _table(result["heldout"])
    if result.get("speedup") is not None:
        note = "" if result.get("timing_comparable") else "  (Triton interpreter: timings not comparable)"
        lines.append(f"speedup (geomean): {result['speedup']:.3g}x vs {result.get('baseline')}{note}")
    if result.get("heldout_speedup") is not None:
        lines.append(f"held-out speedup (geomean): {result['heldout_speedup']:.3g}x")
    for finding in result.get("findings") or []:
        lines.append(f"  line {finding['line']}: {finding['message']}")
    env = result.get("env") or {}
    if env:
        parts = [env.get("gpu") or "cpu", f"torch {env.get('torch')}", f"triton {env.get('triton')}"]
        during = env.get("clocks_during") or {}
        if during.get("sm_mhz"):
            low, high = during["sm_mhz"]
            parts.append(f"SM {low:g}-{high:g} MHz while timing")
        if during.get("temp_c_max") is not None:
            parts.append(f"max {during['temp_c_max']:g} C")
        if env.get("driver"):
            parts.append(f"driver {env['driver']}")
        lines.append("env: " + ", ".join(parts))
    for warning in result.get("warnings") or []:
        lines.append(f"warning: {warning}")
    if result.get("elapsed_s") is not None:
        lines.append(f"elapsed {result['elapsed_s']:.1f} s")
    return "\n".join(lines)
