"""Parallel evaluation (issue 17): candidates per hour with 1 and N evaluation slots, through the pool a run uses.

Run (repo root): PYTHONPATH=. python benchmarks/parallel_throughput.py --device cpu --workers 1,2 --seconds 60
    [--tasks softmax,kda] [--rounds 2] [--modes service,pool] [--spread] [--out parallel_throughput.json]

Each session drives `workbench.fleet.make_pool(task, device, workers=W)` the way the tuner does (the seed's
TUNABLES: the seed's CONFIG, its neighbours, then the rest of the grid, each a candidate source written as an
attempt file), keeping W candidates in flight, for `--seconds` from the pool's creation (its services' start
included); a candidate counts when its result came back inside the session. Sessions of each width alternate
(1, N, 1, N, ... with --rounds) so a drift of the machine's load hits both. Mode "service" is the evaluation
service alone (one EvaluationService, candidates one after another): the reference for `--workers 1`.

Per session: candidates finished and per hour, per slot, verdicts, median wall per candidate, the CPU it cost
(this process and every child: services and candidate processes, all reaped by the end), the machine's busy share
and what other processes used meanwhile, each slot's idle time between a result and its next job, and the
service's phases summed. With --spread (and N slots): the best candidate of the session evaluated once on every
slot (per-GPU speedups of one kernel: their spread), then confirmed with its held-out shapes on the pool's
reference slot, the way a new best stands.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.agent.tunables import config_key, grid, neighbours, read_declared, with_config  # noqa: E402
from workbench.evaluator import EvaluationService  # noqa: E402
from workbench.fleet import make_pool  # noqa: E402
from workbench.fleet.api import EvalJob, JobFailed, JobFinished, JobStarted, SlotChanged  # noqa: E402
from workbench.tasks import load_task  # noqa: E402


def candidates(task_name: str, folder: Path) -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """The tuner's order over the seed's TUNABLES: seed config, neighbours, the grid; each written to a file."""
    task = load_task(task_name)
    seed = task.seed.read_text()
    declared = read_declared(seed)
    seen: set[tuple] = set()
    n = 0
    for config in [declared.config, *neighbours(declared.space, declared.config),
                   *({**declared.config, **g} for g in grid(declared.space))]:
        key = config_key(config)
        if key in seen:
            continue
        seen.add(key)
        n += 1
        path = folder / f"{n:04d}" / "kernel.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        source = with_config(seed, config)
        path.write_text(source)
        yield path, source, config


def _machine_jiffies() -> tuple[int, int]:
    """(total, idle) jiffies of every CPU since boot (0, 0 where /proc/stat is missing)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return 0, 0
    return sum(fields), fields[3] + fields[4]


class Meter:
    """CPU seconds of this process and its reaped children, and the machine's, over a session."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.times0 = os.times()
        self.jiffies0 = _machine_jiffies()

    def read(self) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        t1 = os.times()
        own = (t1.user + t1.system) - (self.times0.user + self.times0.system)
        kids = (t1.children_user + t1.children_system) - (self.times0.children_user + self.times0.children_system)
        total, idle = (a - b for a, b in zip(_machine_jiffies(), self.jiffies0))
        hz = os.sysconf("SC_CLK_TCK")
        busy = (total - idle) / hz if total else None
        cores = os.cpu_count() or 1
        return {"wall_s": round(wall, 2), "cpu_self_s": round(own, 2), "cpu_children_s": round(kids, 2),
                "cpu_ours_s": round(own + kids, 2), "cores_ours": round((own + kids) / wall, 2) if wall else None,
                "machine_busy": round((total - idle) / total, 3) if total else None,
                "cpu_others_s": round(busy - own - kids, 2) if busy is not None else None, "cores": cores}


def _phases(results: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for result in results:
        for name, seconds in (result.get("phases_s") or {}).items():
            out[name] = round(out.get(name, 0.0) + float(seconds), 2)
    return out


def _verdicts(finished: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in finished:
        counts[str(f["verdict"])] = counts.get(str(f["verdict"]), 0) + 1
    return counts


def pool_session(task_name: str, device: str, workers: int, seconds: float, folder: Path) -> dict[str, Any]:
    """One time-boxed session through make_pool with `workers` candidates in flight."""
    meter = Meter()
    source = candidates(task_name, folder)
    pool = make_pool(load_task(task_name), device, workers=workers)
    started_at = time.monotonic()
    end = meter.t0 + seconds
    finished: list[dict[str, Any]] = []
    failed: list[str] = []
    changes: list[str] = []
    last_end: dict[str, float] = {}
    idle: dict[str, float] = {}
    per_slot: dict[str, int] = {}
    n = 0
    try:
        while time.monotonic() < end:
            while pool.pending() < workers:
                path, text, config = next(source)
                n += 1
                pool.submit(EvalJob(f"j{n}", n, path, text))
            for event in pool.events(timeout=max(0.01, min(0.5, end - time.monotonic()))):
                now = time.monotonic()
                if isinstance(event, JobStarted):
                    slot = event.slot.slot
                    idle[slot] = idle.get(slot, 0.0) + (now - last_end.get(slot, started_at))
                elif isinstance(event, JobFinished) and now <= end:
                    slot = event.slot.slot
                    last_end[slot] = now
                    per_slot[slot] = per_slot.get(slot, 0) + 1
                    r = event.result
                    finished.append({"t": round(now - meter.t0, 2), "slot": slot, "verdict": r.get("verdict"),
                                     "speedup": r.get("speedup"), "elapsed_s": r.get("elapsed_s"),
                                     "phases_s": r.get("phases_s"), "measured_on": r.get("measured_on"),
                                     "path": str(event.job.path)})
                elif isinstance(event, JobFailed):
                    failed.append(f"{event.job.id}: {event.message}")
                elif isinstance(event, SlotChanged):
                    changes.append(f"{event.slot.slot} {event.state}: {event.message}")
        pool.cancel_all()
    finally:
        slots = [{"slot": s.info.slot, "gpu": s.info.gpu, "gpu_name": s.info.gpu_name, "state": s.state,
                  "evaluations": s.evaluations} for s in pool.slots()]
        pool.close()
    usage = meter.read()
    walls = [f["elapsed_s"] for f in finished if f.get("elapsed_s")]
    return {"mode": "pool", "workers": workers, "seconds": seconds, "finished": len(finished),
            "per_hour": round(len(finished) * 3600 / seconds, 1), "per_slot": per_slot,
            "verdicts": _verdicts(finished),
            "median_eval_s": round(statistics.median(walls), 3) if walls else None,
            "first_result_s": finished[0]["t"] if finished else None,
            "cpu_per_candidate_s": round(usage["cpu_ours_s"] / len(finished), 2) if finished else None,
            "idle_s": {k: round(v, 2) for k, v in idle.items()}, "phases_s": _phases(finished), "usage": usage,
            "failed": failed, "slot_changes": changes, "slots": slots, "evaluations": finished}


def service_session(task_name: str, device: str, seconds: float, folder: Path) -> dict[str, Any]:
    """The evaluation service alone: one EvaluationService, candidates one after another, same session length."""
    meter = Meter()
    source = candidates(task_name, folder)
    end = meter.t0 + seconds
    finished: list[dict[str, Any]] = []
    with EvaluationService(load_task(task_name), device) as service:
        while time.monotonic() < end:
            path, _, _ = next(source)
            result = service.evaluate(path)
            if time.monotonic() <= end:
                finished.append({"t": round(time.monotonic() - meter.t0, 2), "verdict": result.get("verdict"),
                                 "speedup": result.get("speedup"), "elapsed_s": result.get("elapsed_s"),
                                 "phases_s": result.get("phases_s"), "path": str(path)})
    usage = meter.read()
    walls = [f["elapsed_s"] for f in finished if f.get("elapsed_s")]
    return {"mode": "service", "workers": 1, "seconds": seconds, "finished": len(finished),
            "per_hour": round(len(finished) * 3600 / seconds, 1), "verdicts": _verdicts(finished),
            "median_eval_s": round(statistics.median(walls), 3) if walls else None,
            "first_result_s": finished[0]["t"] if finished else None,
            "cpu_per_candidate_s": round(usage["cpu_ours_s"] / len(finished), 2) if finished else None,
            "phases_s": _phases(finished), "usage": usage, "evaluations": finished}


def spread(task_name: str, device: str, workers: int, path: Path) -> dict[str, Any]:
    """One kernel on every slot (its speedup per GPU), then its held-out check on the reference slot."""
    pool = make_pool(load_task(task_name), device, workers=workers)
    out: dict[str, Any] = {"file": str(path), "per_slot": {}}
    try:
        text = path.read_text()
        names = [s.info.slot for s in pool.slots() if s.state != "skipped"]
        for i, name in enumerate(names):
            pool.submit(EvalJob(f"same{i}", i, path, text, slot=name))
        reference = pool.reference()
        out["reference"] = reference
        pool.submit(EvalJob("confirm", len(names), path, text, heldout=True, kind="heldout", slot=reference))
        ends = 0
        deadline = time.monotonic() + 600
        while ends < len(names) + 1 and time.monotonic() < deadline:
            for event in pool.events(timeout=1.0):
                if isinstance(event, JobFinished):
                    ends += 1
                    r = event.result
                    row = {"verdict": r.get("verdict"), "speedup": r.get("speedup"), "speedup_ci": r.get("speedup_ci"),
                           "measured_on": r.get("measured_on"),
                           "shapes": {s.get("name"): s.get("speedup") for s in r.get("shapes", [])}}
                    if event.job.id == "confirm":
                        out["confirm"] = {**row, "heldout_speedup": r.get("heldout_speedup"),
                                          "heldout_correct": all(s.get("correct") for s in r.get("heldout") or [])}
                    else:
                        out["per_slot"][event.slot.slot] = row
                elif isinstance(event, JobFailed):
                    ends += 1
                    out.setdefault("failed", []).append(f"{event.job.id}: {event.message}")
    finally:
        pool.close()
    speeds = [r["speedup"] for r in out["per_slot"].values() if r.get("speedup")]
    if speeds:
        mid = statistics.median(speeds)
        out["spread"] = round((max(speeds) - min(speeds)) / mid, 4) if mid else None
    return out


def faults(task_name: str, device: str, workers: int) -> dict[str, Any]:
    """Fault injection through the pool: a candidate's own GPU fault (a result: crash, the slot not faulted), then
    the slot's service process killed twice under one job (its service replaced, the job run again on another slot,
    or on the same one when it is the only one), then one more good candidate. Seconds and events for each."""
    from workbench.evaluator.selftest import CASES_DIR
    from workbench.fleet.local import LocalPool

    pool: LocalPool = make_pool(load_task(task_name), device, workers=workers)
    out: dict[str, Any] = {}
    seed = load_task(task_name).seed

    names = [s.info.slot for s in pool.slots() if s.state != "skipped"]

    def restore() -> None:
        for slot in names:
            pool.runner(slot).on_phase = functools.partial(pool.set_phase, slot)  # type: ignore[attr-defined]

    def one(name: str, path: Path, kill: int = 0) -> dict[str, Any]:
        killed: list[int] = []
        victim: list[str] = []
        """The slot whose service is killed: the first that runs the job's candidate steps."""
        for slot in names if kill else []:
            runner = pool.runner(slot)

            def on_phase(phase: str, runner: Any = runner, slot: str = slot) -> None:
                pool.set_phase(slot, phase)
                service = runner.service
                pid = service.health().pid if service is not None else None
                if len(killed) < kill and pid and pid not in killed and phase.startswith("forward") and \
                        victim in ([], [slot]):
                    victim[:] = [slot]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            runner.on_phase = on_phase  # type: ignore[attr-defined]
        t0 = time.monotonic()
        pool.submit(EvalJob(name, 0, path, path.read_text()))
        events: list[str] = []
        row: dict[str, Any] = {}
        while "end" not in row and time.monotonic() - t0 < 300:
            for event in pool.events(timeout=1.0):
                slot_name = event.slot.slot if getattr(event, "slot", None) else None
                events.append(f"{type(event).__name__} {slot_name} {getattr(event, 'state', '')} "
                              f"{getattr(event, 'message', '')[:160]}".strip())
                if isinstance(event, JobFinished):
                    row.update(end="finished", verdict=event.result.get("verdict"),
                               message=event.result.get("message", "")[:300], slot=slot_name,
                               reruns=(event.result.get("service") or {}).get("reruns"))
                elif isinstance(event, JobFailed):
                    row.update(end="failed", message=event.message)
        restore()
        row.update(wall_s=round(time.monotonic() - t0, 2), killed=len(killed), killed_on=victim, events=events,
                   slots={s.info.slot: (s.state, s.faults) for s in pool.slots()})
        return row

    try:
        out["warm"] = one("warm", seed)
        out["candidate_fault"] = one("segfault", CASES_DIR / task_name / "segfault.py")
        out["service_killed_twice"] = one("killed", seed, kill=2)
        out["after"] = one("after", seed)
    finally:
        pool.close()
    return out


def import_cost() -> dict[str, Any]:
    """CPU seconds of the imports every fresh candidate process pays (its torch, Triton and our modules)."""
    code = ("import numpy, torch, triton, triton.language\n"
            "from workbench.evaluator import diagnose, inputs, loading, slab, timing, warm, wire\n"
            "from workbench.evaluator.guards import runtime\n")
    before = os.times()
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
                   capture_output=True, timeout=120)
    after = os.times()
    return {"wall_s": round(time.monotonic() - t0, 2),
            "cpu_s": round((after.children_user + after.children_system)
                           - (before.children_user + before.children_system), 2)}


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "host": socket.gethostname(),
                           "cpus": os.cpu_count()}
    for name in ("torch", "triton"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15, check=False)
        out["gpus"] = [line.strip() for line in smi.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired):
        out["gpus"] = []
    return out


def summarise(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task and width: candidates per hour (each session and the mean), and N slots against 1 slot."""
    table: dict[str, dict[str, list[float]]] = {}
    for s in sessions:
        if "per_hour" not in s:
            continue
        key = f"{s['mode']}:{s['workers']}"
        table.setdefault(s["task"], {}).setdefault(key, []).append(s["per_hour"])
    out: dict[str, Any] = {}
    for task, rows in table.items():
        means = {k: round(statistics.mean(v), 1) for k, v in rows.items()}
        entry: dict[str, Any] = {"per_hour": rows, "mean_per_hour": means}
        one = means.get("pool:1")
        for key, value in means.items():
            if key.startswith("pool:") and key != "pool:1" and one:
                entry[f"ratio_{key.split(':')[1]}_to_1"] = round(value / one, 3)
        if one and means.get("service:1"):
            entry["pool1_to_service"] = round(one / means["service:1"], 3)
        out[task] = entry
    return out


def main() -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/parallel_throughput.py")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workers", default="1,2", help="slot counts to compare, e.g. 1,8")
    parser.add_argument("--tasks", default="softmax")
    parser.add_argument("--seconds", type=float, default=60.0, help="each session's length")
    parser.add_argument("--rounds", type=int, default=1, help="sessions of each width, alternating")
    parser.add_argument("--modes", default="pool", help="pool and/or service (the evaluation service alone)")
    parser.add_argument("--spread", action="store_true", help="the best kernel on every slot, then confirmed")
    parser.add_argument("--faults", action="store_true", help="fault injection through the pool (see faults())")
    parser.add_argument("--out", default="parallel_throughput.json")
    args = parser.parse_args()
    widths = [int(w) for w in args.workers.split(",")]
    modes = args.modes.split(",")
    report: dict[str, Any] = {"date": datetime.date.today().isoformat(), "device": args.device,
                              "command": " ".join(sys.argv), "versions": versions(), "sessions": []}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # a run cut short still writes what it measured
    scratch = Path(tempfile.mkdtemp(prefix="parallel-throughput-"))
    try:
        report["import_cost"] = import_cost()
        for task in args.tasks.split(","):
            plan = [("service", 1)] if "service" in modes else []
            plan += [("pool", w) for w in widths] if "pool" in modes else []
            for round_ in range(args.rounds):
                for mode, width in (plan if round_ % 2 == 0 else plan[::-1]):
                    label = f"{task} {mode} workers={width} round {round_ + 1}"
                    folder = scratch / f"{task}-{mode}-{width}-{round_}"
                    try:
                        if mode == "service":
                            session = service_session(task, args.device, args.seconds, folder)
                        else:
                            session = pool_session(task, args.device, width, args.seconds, folder)
                    except Exception as exc:  # noqa: BLE001 - one session's failure must not lose the others
                        session = {"mode": mode, "workers": width, "error": f"{type(exc).__name__}: {exc}",
                                   "traceback": traceback.format_exc()}
                    session.update(task=task, round=round_ + 1)
                    report["sessions"].append(session)
                    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
                    print(f"[{label}] {session.get('finished')} in {args.seconds:g} s = {session.get('per_hour')}/h, "
                          f"cpu {session.get('cpu_per_candidate_s')} s/candidate, "
                          f"usage {session.get('usage')}", flush=True)
            if args.spread:
                best = max((e for s in report["sessions"] if s.get("task") == task and s.get("mode") == "pool"
                            for e in s.get("evaluations", []) if e.get("verdict") == "ok" and e.get("speedup")),
                           key=lambda e: e["speedup"], default=None)
                if best is not None:
                    try:
                        report.setdefault("spread", {})[task] = spread(task, args.device, max(widths),
                                                                       Path(best["path"]))
                    except Exception as exc:  # noqa: BLE001
                        report.setdefault("spread", {})[task] = {"error": f"{type(exc).__name__}: {exc}"}
                    print(f"[{task} spread] {json.dumps(report['spread'][task], default=str)[:600]}", flush=True)
            if args.faults:
                try:
                    report.setdefault("faults", {})[task] = faults(task, args.device, max(widths))
                except Exception as exc:  # noqa: BLE001
                    report.setdefault("faults", {})[task] = {"error": f"{type(exc).__name__}: {exc}",
                                                             "traceback": traceback.format_exc()}
                Path(args.out).write_text(json.dumps(report, indent=1, default=str))
                for name, row in report["faults"][task].items():
                    if isinstance(row, dict):
                        print(f"[{task} faults {name}] " + json.dumps({k: v for k, v in row.items() if k != "events"},
                                                                      default=str)[:500], flush=True)
    finally:
        report["summary"] = summarise(report["sessions"])
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
