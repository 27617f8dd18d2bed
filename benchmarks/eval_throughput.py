"""Evaluation throughput (issue 16): wall time per candidate through one EvaluationService, as an agent run sees it.

Run (repo root): PYTHONPATH=. python benchmarks/eval_throughput.py --device cuda --out eval_throughput.json
    [--sections fresh,loop,hang,old] [--old-root DIR] [--think S] [--rounds N]

Sections, each timed from the caller's side (the agent's view), each failure recorded rather than fatal:
- fresh: the first kda evaluation on a fresh machine: empty Triton caches (service and candidates), a new service,
  the shipped kernel; then a second new service on the now-warm caches (the baseline's autotuning kept on disk:
  its "baseline" phase shows whether FLA autotuned again).
- loop: per task, several candidates (our kernel and the shipped seed in turn, then ours again) through one service
  with `--think` seconds between them (an agent's turn); per evaluation its wall time, verdict, speedup and its 95%
  interval, phases. The kda service is a second fresh process on the caches the fresh section filled.
- hang (with loop, in the softmax service): a Python infinite loop and a GPU kernel that never ends: seconds from
  evaluate() to the timeout verdict, and the next candidate's verdict.
- old: the evaluator of before the service (`--old-root`, a checkout of it; one fresh process pair per call) on
  our kernels, same task folder and GPU in the same run: its speedups beside this service's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.evaluator import EvaluationService  # noqa: E402
from workbench.evaluator.selftest import CASES_DIR  # noqa: E402
from workbench.tasks import load_task, tasks_root  # noqa: E402

OURS = {"softmax": CASES_DIR / "softmax" / "good_simple.py", "mla_decode": "mla_splitkv.py", "kda": "kda_chunked.py"}
"""Each task's better kernel: ours for kda and mla_decode; for softmax a one-program-per-row self-test kernel."""


def _file(task: str, name: str | Path) -> Path:
    return name if isinstance(name, Path) else tasks_root() / task / name


def _summary(result: dict[str, Any], wall: float) -> dict[str, Any]:
    return {
        "wall_s": round(wall, 3), "verdict": result.get("verdict"), "message": result.get("message", "")[:300],
        "speedup": result.get("speedup"), "speedup_ci": result.get("speedup_ci"),
        "precision": result.get("precision"), "prestarted": result.get("prestarted"),
        "phases_s": result.get("phases_s"), "cache": result.get("cache"), "service": result.get("service"),
        "isolation": result.get("isolation"), "compiles": len(result.get("compiles") or []),
        "shapes": [{k: s.get(k) for k in ("name", "ms", "baseline_ms", "speedup", "speedup_ci", "precision", "reps",
                                          "graph_ms", "baseline_graph_ms")} for s in result.get("shapes", [])],
    }


def fresh(device: str, out: dict[str, Any]) -> dict[str, Any]:
    """The first kda evaluation with empty caches, then a second service on the warm caches; every step the
    service announces is kept with its time, so a run cut short still shows where the time went."""
    task = load_task("kda")
    for label in ("first", "second"):
        started = time.monotonic()
        steps: list[tuple[float, str]] = []
        out[label] = {"steps": steps}

        def note(stage: dict[str, Any], started: float = started, steps: list = steps) -> None:
            name = stage.get("stage", "?") + (f":{stage['shape']}" if "shape" in stage else "")
            if not steps or steps[-1][1] != name:
                steps.append((round(time.monotonic() - started, 2), name))

        with EvaluationService(task, device, prepare_heldout=False) as service:
            result = service.evaluate(_file("kda", OURS["kda"]), on_stage=note)
        out[label].update(_summary(result, time.monotonic() - started))
    return out


def loop(device: str, tasks: list[str], rounds: int, think: float, hangs: bool,
         out: dict[str, Any]) -> dict[str, Any]:
    """Candidates in turn through one service per task, an agent's think time between them; with hangs, the
    softmax service then gets the two hanging candidates and one more good one."""
    for name in tasks:
        task = load_task(name)
        files = [_file(name, OURS[name]), _file(name, "seed.py")] * rounds + [_file(name, OURS[name])]
        evals: list[dict[str, Any]] = []
        out[name] = {"evaluations": evals}
        started = time.monotonic()
        with EvaluationService(task, device, prepare_heldout=False) as service:
            for path in files:
                t0 = time.monotonic()
                result = service.evaluate(path)
                evals.append({"file": path.name, **_summary(result, time.monotonic() - t0)})
                time.sleep(think)
            if hangs and name == "softmax":
                out["hang"] = hang(device, service)
            health = service.health()
        steady = [e["wall_s"] for e in evals[1:]]
        out[name] = {"evaluations": evals, "total_s": round(time.monotonic() - started, 3),
                     "median_after_first_s": statistics.median(steady) if steady else None,
                     "max_after_first_s": max(steady) if steady else None,
                     "health": {"restarts": health.restarts, "faults": [f.kind for f in health.faults],
                                "prestarted": health.prestarted}}
    return out


def hang(device: str, service: EvaluationService) -> dict[str, Any]:
    """Seconds from evaluate() to a timeout verdict through a warm service, then whether the next one is sound."""
    out: dict[str, Any] = {}
    for name in ["infinite_loop.py"] + (["gpu_spin.py"] if device == "cuda" else []):
        t0 = time.monotonic()
        result = service.evaluate(CASES_DIR / "softmax" / name)
        out[name] = {"wall_s": round(time.monotonic() - t0, 3), "verdict": result["verdict"],
                     "message": result["message"][:300]}
    t0 = time.monotonic()
    after = service.evaluate(_file("softmax", "seed.py"))
    out["after"] = {"wall_s": round(time.monotonic() - t0, 3), "verdict": after["verdict"]}
    return out


def old(device: str, old_root: Path, tasks: list[str]) -> dict[str, Any]:
    """The evaluator before the service, on our kernels (its own CLI, its own processes), same task folder."""
    out: dict[str, Any] = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(old_root)] + [p for p in os.environ.get(
        "PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT.resolve()]),
           "WORKBENCH_KERNELS": str(tasks_root())}
    for name in tasks:
        path = _file(name, OURS[name])
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "workbench", "eval", name, str(path), "--device", device,
                               "--json"], cwd=old_root, env=env, capture_output=True, text=True, timeout=300)
        wall = time.monotonic() - t0
        try:
            result = json.loads(proc.stdout)
        except ValueError:
            out[name] = {"error": (proc.stderr or proc.stdout)[-800:], "wall_s": round(wall, 3)}
            continue
        out[name] = _summary(result, wall)
    return out


def agreement(sections: dict[str, Any]) -> dict[str, Any]:
    """Our kernels' speedups here against the old evaluator's, same run: the ratio per task and per shape."""
    found: dict[str, Any] = {}
    for name, before in (sections.get("old") or {}).items():
        runs = [e for e in (sections.get("loop") or {}).get(name, {}).get("evaluations", [])
                if e.get("file") == Path(str(OURS[name])).name and e.get("speedup")]
        if not runs or not before.get("speedup"):
            continue
        new = statistics.median(e["speedup"] for e in runs)
        shapes = {}
        for shape in before.get("shapes", []):
            ours = [next((s["speedup"] for s in e["shapes"] if s["name"] == shape["name"]), None) for e in runs]
            ours = [x for x in ours if x]
            if ours and shape.get("speedup"):
                shapes[shape["name"]] = round(statistics.median(ours) / shape["speedup"], 4)
        found[name] = {"new": new, "old": before["speedup"], "ratio": round(new / before["speedup"], 4),
                       "shapes": shapes}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/eval_throughput.py")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default="eval_throughput.json")
    parser.add_argument("--sections", default="fresh,loop,hang,old")
    parser.add_argument("--tasks", default="softmax,mla_decode,kda")
    parser.add_argument("--old-root", type=Path, default=None)
    parser.add_argument("--think", type=float, default=2.0, help="seconds between candidates (an agent's turn)")
    parser.add_argument("--rounds", type=int, default=1, help="ours and the seed this many times, then ours, per task")
    args = parser.parse_args()
    chosen = args.sections.split(",")
    tasks = args.tasks.split(",")
    report: dict[str, Any] = {"date": datetime.date.today().isoformat(), "device": args.device,
                              "command": " ".join(sys.argv), "think_s": args.think, "sections": {}}
    if "fresh" in chosen:
        # Empty caches for everything started from here on: this run is the machine's first.
        scratch = Path(tempfile.mkdtemp(prefix="eval-throughput-"))
        os.environ["TRITON_CACHE_DIR"] = str(scratch / "triton")
        os.environ["XDG_CACHE_HOME"] = str(scratch / "xdg")
    steps = {"fresh": lambda out: fresh(args.device, out),
             "loop": lambda out: loop(args.device, tasks, args.rounds, args.think, "hang" in chosen, out),
             "old": lambda out: old(args.device, args.old_root, tasks) if args.old_root else {"skipped": "no --old-root"}}
    # A run cut short by its caller's timeout still writes what it measured so far.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    try:
        for name in ("fresh", "loop", "old"):
            if name not in chosen:
                continue
            t0 = time.monotonic()
            section: dict[str, Any] = {}
            report["sections"][name] = section
            try:
                section.update(steps[name](section))
            except Exception as exc:  # noqa: BLE001 - one section's failure must not lose the others' figures
                section.update(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
            report["sections"][name + "_s"] = round(time.monotonic() - t0, 1)
            Path(args.out).write_text(json.dumps(report, indent=1, default=str))
            print(f"[{name}] done in {report['sections'][name + '_s']} s", flush=True)
    finally:
        report["agreement"] = agreement(report["sections"])
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    for name, data in (report["sections"].get("loop") or {}).items():
        if isinstance(data, dict) and "evaluations" in data:
            walls = " ".join(f"{e['file']}:{e['wall_s']:.1f}s/{e['verdict']}" for e in data["evaluations"])
            print(f"loop {name}: {walls}")
    print(json.dumps({"fresh": {k: v.get("wall_s") for k, v in (report["sections"].get("fresh") or {}).items()
                                if isinstance(v, dict)},
                      "hang": (report["sections"].get("loop") or {}).get("hang"), "agreement": report["agreement"]},
                     default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
