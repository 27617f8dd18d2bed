"""Deltas between two profiles ("occupancy 6% -> 38%"): what a change moved, per shape and per kernel."""

from __future__ import annotations

from typing import Any, Callable

Fmt = Callable[[float], str]
_PCT: Fmt = lambda v: f"{v:.0f}%"  # noqa: E731 - the tables below read best with named formatters
_COUNT: Fmt = lambda v: f"{v:.0f}"  # noqa: E731
_KIB: Fmt = lambda v: f"{v / 1024:.1f} KiB"  # noqa: E731

_SHAPE_KEYS: list[tuple[str, str, Fmt]] = [
    ("ms", "time", lambda v: f"{v:.4g} ms"), ("tb_s", "bandwidth", lambda v: f"{v:.3g} TB/s"),
    ("fraction", "roofline", lambda v: _PCT(100 * v)),
]
_NCU_KEYS: list[tuple[str, str, Fmt]] = [
    ("duration_ns", "duration", lambda v: f"{v / 1e3:.1f} us"), ("occupancy_pct", "occupancy", _PCT),
    ("dram_pct", "DRAM throughput", _PCT), ("sm_pct", "SM throughput", _PCT), ("l2_pct", "L2 throughput", _PCT),
    ("l2_hit_pct", "L2 hit rate", _PCT), ("registers", "registers/thread", _COUNT),
    ("smem_per_block", "smem/block", _KIB), ("grid", "grid", _COUNT),
]
_COMPILE_KEYS: list[tuple[str, str, Fmt]] = [
    ("regs", "registers/thread", _COUNT), ("spills", "spills", _COUNT), ("shared", "smem/block", _KIB),
]
MIN_CHANGE = 0.02
"""Relative changes smaller than this are noise and not reported."""


def _changed(a: Any, b: Any) -> bool:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return False
    if a == b:
        return False
    scale = max(abs(a), abs(b))
    return scale > 0 and abs(a - b) / scale >= MIN_CHANGE


def _lines(prefix: str, old: dict[str, Any], new: dict[str, Any],
           keys: list[tuple[str, str, Fmt]]) -> list[str]:
    out = []
    for key, label, fmt in keys:
        a, b = old.get(key), new.get(key)
        if _changed(a, b):
            out.append(f"{prefix}{label} {fmt(a)} -> {fmt(b)}")
    return out


def diff(prev: dict[str, Any], cur: dict[str, Any]) -> list[str]:
    """Human-readable changes from a previous profile to the current one (same task), most structural first.

    Args:
        prev, cur: profiles as evaluate() puts them under result["profile"] (shapes with ms and roofline,
            compile stats, optional ncu rows).

    Returns:
        Lines such as "S1: time 0.31 ms -> 0.12 ms" or "_softmax_tile: occupancy 6% -> 38%".
    """
    lines: list[str] = []
    old_shapes = {s.get("name"): s for s in prev.get("shapes") or []}
    for shape in cur.get("shapes") or []:
        old = old_shapes.get(shape.get("name"))
        if old is None:
            continue
        flat_old = {"ms": old.get("ms"), **(old.get("roofline") or {})}
        flat_new = {"ms": shape.get("ms"), **(shape.get("roofline") or {})}
        lines += _lines(f"{shape['name']}: ", flat_old, flat_new, _SHAPE_KEYS)
        if flat_old.get("bound") and flat_new.get("bound") and flat_old["bound"] != flat_new["bound"]:
            lines.append(f"{shape['name']}: {flat_old['bound']}-bound -> {flat_new['bound']}-bound")
        old_k = {k["name"] for k in old.get("kernels") or [] if k.get("kind", "kernel") == "kernel"}
        new_k = {k["name"] for k in shape.get("kernels") or [] if k.get("kind", "kernel") == "kernel"}
        if old_k and new_k and old_k != new_k:
            lines.append(f"{shape['name']}: kernels {', '.join(sorted(old_k))} -> {', '.join(sorted(new_k))}")
    old_compile = {c.get("kernel"): c for c in prev.get("compile") or []}
    for stat in cur.get("compile") or []:
        old = old_compile.get(stat.get("kernel"))
        if old is not None:
            lines += _lines(f"{stat['kernel']}: ", old, stat, _COMPILE_KEYS)
    old_ncu = {r.get("kernel"): r.get("metrics") or {} for r in (prev.get("ncu") or {}).get("rows") or []}
    for row in (cur.get("ncu") or {}).get("rows") or []:
        old = old_ncu.get(row.get("kernel"))
        if old is not None:
            lines += _lines(f"{row['kernel']}: ", old, row.get("metrics") or {}, _NCU_KEYS)
    return lines
