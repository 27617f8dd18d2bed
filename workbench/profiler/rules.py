"""Rules that name an unaddressed bottleneck from a profile: small grid, spills, low occupancy, far from the roof.

Each rule reads what is there (the evaluator's kernel table and roofline, Triton's compile stats, ncu rows when
asked for) and says nothing when its evidence is missing, so advice never rests on a guess.
"""

from __future__ import annotations

from typing import Any

H200_SMS = 132
"""Streaming multiprocessors of the H200, used when the profile does not say."""
LOW_OCCUPANCY_PCT = 25.0
"""Achieved occupancy below this leaves too few warps to hide memory latency on a memory-bound kernel."""
FAR_FRACTION = 0.5
"""A memory- or compute-bound shape under this fraction of its roof has headroom worth chasing."""
MANY_KERNELS = 3
"""More launches than this per call on a latency- or launch-bound shape suggests fusing."""


def _finding(rule: str, message: str, *, shape: str | None = None, kernel: str | None = None,
             severity: str = "warn") -> dict[str, Any]:
    return {"rule": rule, "severity": severity, "shape": shape, "kernel": kernel, "message": message}


def advise(profile: dict[str, Any], sms: int | None = None) -> list[dict[str, Any]]:
    """Findings for one profile, most important first.

    Args:
        profile: {"shapes": [{"name", "roofline": {...}, "kernels": [kernel-table rows], "calls"}],
                  "compile": [{"kernel", "regs", "spills", ...}], "ncu": {"rows": [{"kernel", "metrics"}]}}; any
                  part may be missing.
        sms: the GPU's SM count (default H200_SMS).

    Returns:
        [{"rule", "severity", "shape", "kernel", "message"}].
    """
    sms = sms or H200_SMS
    found: list[dict[str, Any]] = []
    for shape in profile.get("shapes") or []:
        name = shape.get("name")
        roof = shape.get("roofline") or {}
        bound, fraction = roof.get("bound"), roof.get("fraction")
        if bound in ("memory", "compute") and fraction is not None and fraction < FAR_FRACTION:
            found.append(_finding("far-from-roofline", f"{name}: {bound}-bound at {100 * fraction:.0f}% of the "
                                  f"realistic roof ({roof.get('reason', '')})", shape=name))
        elif bound == "latency":
            found.append(_finding("latency-bound", f"{name}: {roof.get('reason', 'latency-bound')}", shape=name))
        elif bound == "launch":
            found.append(_finding("launch-bound", f"{name}: {roof.get('reason', 'launch-bound')}; fewer launches "
                                  "(fusion) or more work per launch helps", shape=name, severity="info"))
        kernels = [k for k in shape.get("kernels") or [] if k.get("kind", "kernel") == "kernel"]
        calls = max(int(shape.get("calls") or 1), 1)
        launches = sum(int(k.get("calls", 0)) for k in kernels) / calls
        if bound in ("latency", "launch") and launches > MANY_KERNELS:
            found.append(_finding("many-launches", f"{name}: {launches:.0f} kernel launches per call on a "
                                  f"{bound}-bound shape; fuse them", shape=name))
        for k in kernels:
            grid = k.get("grid")
            blocks = _blocks(grid)
            if blocks is not None and blocks < sms:
                found.append(_finding("grid-smaller-than-sms", f"{name}: {k['name']} runs {blocks} blocks on "
                                      f"{sms} SMs, so {sms - blocks} SMs idle; split the work finer",
                                      shape=name, kernel=k["name"]))
    for stat in profile.get("compile") or []:
        spills = stat.get("spills")
        if spills:
            found.append(_finding("register-spills", f"{stat['kernel']}: {spills} register spill(s) to local "
                                  f"memory at {stat.get('regs')} registers/thread; smaller tiles or fewer live "
                                  "values", kernel=stat["kernel"]))
    ncu = profile.get("ncu") or {}
    seen_small_grid = {(f["kernel"]) for f in found if f["rule"] == "grid-smaller-than-sms"}
    for row in ncu.get("rows") or []:
        m = row.get("metrics") or {}
        kernel = row.get("kernel")
        grid = m.get("grid")
        if grid is not None and grid < sms and kernel not in seen_small_grid:
            found.append(_finding("grid-smaller-than-sms", f"{kernel}: grid of {grid:.0f} blocks on {sms} SMs "
                                  "(ncu)", kernel=kernel))
        occ = m.get("occupancy_pct")
        if occ is not None and occ < LOW_OCCUPANCY_PCT:
            theo = m.get("theoretical_occupancy_pct")
            why = f" (theoretical {theo:.0f}%: registers or shared memory cap it)" if theo is not None and theo < 50 \
                else ""
            found.append(_finding("low-occupancy", f"{kernel}: achieved occupancy {occ:.0f}%{why}", kernel=kernel))
        local = (m.get("local_ld") or 0) + (m.get("local_st") or 0)
        if local > 0 and not any(f["rule"] == "register-spills" and f["kernel"] == kernel for f in found):
            found.append(_finding("register-spills", f"{kernel}: {local:.0f} local-memory instructions (spills) "
                                  "(ncu)", kernel=kernel))
        stalls = m.get("stall_top") or []
        busy = {"DRAM": m.get("dram_pct"), "L2": m.get("l2_pct"), "SM": m.get("sm_pct")}
        if stalls and all((v or 0) < 60 for v in busy.values()):
            top = ", ".join(f"{s['reason']} {s['cycles']:.1f}" for s in stalls[:2])
            units = ", ".join(f"{name} {v:.0f}%" for name, v in busy.items() if v is not None)
            found.append(_finding("stalls", f"{kernel}: {units} busy; top warp stalls (cycles/issue): {top}",
                                  kernel=kernel, severity="info"))
    order = {"warn": 0, "info": 1}
    return sorted(found, key=lambda f: order.get(f["severity"], 2))


def _blocks(grid: Any) -> int | None:
    if isinstance(grid, (list, tuple)) and grid and all(isinstance(g, (int, float)) for g in grid):
        total = 1
        for g in grid:
            total *= int(g)
        return total
    if isinstance(grid, (int, float)):
        return int(grid)
    return None
