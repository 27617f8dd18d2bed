"""evaluate(): static checks in this process, then a trusted harness and a candidate worker in fresh process groups.

This module never imports torch: the process that calls evaluate() (the CLI, the agent runtime) stays light and
is never exposed to candidate code. It owns every pipe, enforces the deadlines, and decides the verdict from what
the trusted harness measured.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.evaluator import verdict as verdicts
from workbench.evaluator import wire
from workbench.evaluator.errors import EvalUsageError
from workbench.evaluator.guards import check_static
from workbench.evaluator.guards.static import jit_functions
from workbench.evaluator.prestart import Pair, Prestarter
from workbench.devices import DeviceError, resolve_device

if TYPE_CHECKING:
    from workbench.tasks import Task

DEFAULT_TIMEOUT_S = {"cpu": 300.0, "cuda": 600.0}
"""Whole-evaluation wall-clock limit when the caller gives none."""
STAGE_BUDGETS_S = {"startup": 180.0, "load": 180.0, "call": 120.0, "time": 240.0}
"""Per-stage limits (never beyond the overall one): a hang is caught at the stage it happens in, with its name.
"startup" and "load" include importing torch and triton on a cold machine; "call" includes a first Triton compile."""
BLOCKS = 10
"""Interleaved A/B blocks per shape on CUDA."""
LOST_WAIT_S = 5.0
"""How long a worker that dropped its pipe gets to finish dying, so its exit status can name the signal."""
_PARENT_FRAME_LIMIT = 64 << 20
KEEP_ENV = "WORKBENCH_EVAL_KEEP"
"""Set (to anything) to keep each evaluation's private folder, with the children's logs, for debugging."""


def _status(proc: subprocess.Popen) -> int | None:
    """The child's exit status in Popen's convention (-N for signal N), or None while it runs.

    It peeks without reaping, so the pid, and with it the process-group id, stays reserved until Pair.discard kills its group.
    """
    if proc.returncode is not None:
        return proc.returncode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def _exited(proc: subprocess.Popen) -> bool:
    return _status(proc) is not None


def _wait_exit(procs: list[subprocess.Popen], seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not all(_exited(p) for p in procs):
        time.sleep(0.02)


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _log_tail(log: Path, private: str, display: str) -> tuple[str, int | None]:
    """The last meaningful line of a child's output, and the last candidate line a faulthandler dump names."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "", None
    found = re.findall(r'File "' + re.escape(private) + r'", line (\d+)', text)
    line = int(found[-1]) if found else None
    # A faulthandler dump (after a fatal signal) lists frames and extension modules: the line number is all we
    # want from it, and the signal itself is named from the exit status.
    text = text.split("Fatal Python error:")[0]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[-1].replace(private, display)[:300] if lines else ""), line


def _describe(stage: dict[str, Any]) -> str:
    name = stage.get("stage", "startup")
    text = {
        "startup": "starting the evaluator processes",
        "load": "importing the candidate",
        "forward": "running forward",
        "warmup": "warming up forward",
        "timing": "timing forward",
        "revalidate": "re-checking forward's output after timing",
        "profile": "profiling forward",
        "graph": "timing forward under a CUDA graph",
    }.get(name, name)
    if "shape" in stage:
        text += f" on shape {stage['shape']}"
    if stage.get("seed") is not None:
        text += f", seed {stage['seed']}"
    return text


class _Run:
    """The process part of one evaluation: spawn, watch, collect, clean up."""

    def __init__(self, task: "Task", path: Path, data: bytes, device: str, heldout: bool, seeds: int, timeout: float,
                 jit_names: list[str], graph: bool = False):
        self.task, self.path, self.data, self.device = task, path, data, device
        self.graph = graph
        self.heldout, self.seeds, self.timeout = heldout, seeds, timeout
        self.jit_names = jit_names

    def _groups(self) -> list[dict[str, Any]]:
        public, hidden = ("cuda", "heldout") if self.device == "cuda" else ("cpu", "heldout_cpu")
        groups = [{"group": public, "role": "public", "shapes": [s.to_dict() for s in self.task.shapes[public]]}]
        if self.heldout:
            groups.append({"group": hidden, "role": "heldout", "shapes": [s.to_dict() for s in self.task.shapes[hidden]]})
        return groups

    def execute(self, prestarter: Prestarter | None = None) -> dict[str, Any]:
        """Run the harness and the worker; return the outcome: {"kind": "result" | "timeout" | ..., ...}.

        With a prestarter, a pair it started earlier is used when one is ready (and its start-up is not waited
        for); either way the pair serves this evaluation only.
        """
        pair = prestarter.take(self.device) if prestarter is not None else None
        self.prestarted = pair is not None
        if pair is None:
            pair = Pair(self.device)
        try:
            private = pair.cand_dir / self.path.name
            private.write_bytes(self.data)  # the bytes hashed are the bytes run, even if the file changes now
            worker_cfg = {
                "candidate": str(private),
                "display": str(self.path),
                "entry": self.task.entry,
                "device": self.device,
                "fd_in": pair.worker_fds[0],
                "fd_out": pair.worker_fds[1],
                "forbidden_imports": list(self.task.forbidden_imports),
                "max_frame": 1 << 28,
                "reference": str(self.task.reference),
                "task_dir": str(self.task.dir),
                "slab_in": str(pair.slabs / "to_worker.slab"),
                "slab_out": str(pair.slabs / "to_harness.slab"),
            }
            harness_cfg = {
                "task": self.task.name,
                "reference": str(self.task.reference),
                "baseline": str(self.task.baseline) if self.task.baseline else None,
                "entry": self.task.entry,
                "outputs": list(self.task.outputs),
                "tols": [self.task.tol(o) for o in self.task.outputs],
                "device": self.device,
                "seeds": list(range(self.seeds)),
                "groups": self._groups(),
                "blocks": BLOCKS,
                "budgets": dict(STAGE_BUDGETS_S),
                "fd_worker_out": pair.harness_fds[0],
                "fd_worker_in": pair.harness_fds[1],
                "fd_parent": pair.harness_fds[2],
                "slab_out": str(pair.slabs / "to_worker.slab"),
                "slab_in": str(pair.slabs / "to_harness.slab"),
                "display": str(self.path),
                "jit_names": self.jit_names,
                "profile_baseline": True,
                "graph": self.graph,
            }
            self.worker_log, self.private = pair.worker_log, str(private)
            pair.send(worker_cfg, harness_cfg)
            outcome = self._watch(pair.parent_in)
            return self._finish(outcome, pair.harness, pair.worker, pair.tmp)
        finally:
            keep = bool(os.environ.get(KEEP_ENV))
            pair.discard(keep_dir=keep)
            if keep:
                self.kept_dir = str(pair.tmp)

    def _watch(self, fd: int) -> dict[str, Any]:
        """Read the harness's messages until its final one, enforcing the stage and overall deadlines."""
        reader = wire.FrameReader(_PARENT_FRAME_LIMIT)
        start = time.monotonic()
        deadline = start + self.timeout
        stage: dict[str, Any] = {"stage": "startup"}
        stage_end = start + min(STAGE_BUDGETS_S["startup"], self.timeout)
        info: dict[str, Any] = {"phases": {}}
        last = ("startup", start)

        def mark(name: str) -> None:
            nonlocal last
            now = time.monotonic()
            info["phases"][last[0]] = round(info["phases"].get(last[0], 0.0) + now - last[1], 3)
            last = (name, now)

        while True:
            now = time.monotonic()
            if now >= min(deadline, stage_end):
                overall = now >= deadline
                return {"kind": "timeout", "stage": stage, "elapsed": now - start, "overall": overall,
                        "limit": self.timeout if overall else stage.get("budget_s", STAGE_BUDGETS_S["startup"]), **info}
            ready, _, _ = select.select([fd], [], [], min(deadline, stage_end) - now)
            if not ready:
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                return {"kind": "harness_died", "stage": stage, **info}
            try:
                frames = reader.feed(data)
            except wire.WireError as exc:
                return {"kind": "harness_error", "message": str(exc), "stage": stage, **info}
            for frame in frames:
                msg = json.loads(frame)
                kind = msg.get("type")
                if kind == "stage":
                    mark(msg.get("stage", "?"))
                    stage = msg
                    stage_end = time.monotonic() + float(msg.get("budget_s", self.timeout))
                elif kind == "env":
                    info["env"] = msg["env"]
                elif kind in ("result", "worker_lost", "harness_error", "usage_error"):
                    mark("done")
                    # The final message's env (with clocks sampled during timing) supersedes the early one.
                    return {"kind": kind, **info, **msg, "stage": msg.get("stage", stage)}

    def _finish(self, outcome: dict[str, Any], harness: subprocess.Popen, worker: subprocess.Popen,
                tmp: Path) -> dict[str, Any]:
        kind = outcome["kind"]
        if kind in ("worker_lost", "harness_died"):
            _wait_exit([worker, harness], LOST_WAIT_S)
            display = str(self.path)
            tail, line = _log_tail(self.worker_log, self.private, display)
            where = f"{display}:{line}" if line else display
            rc = _status(worker)
            if kind == "worker_lost" or (rc is not None and rc != 0):
                how = (f"was killed by {_signal_name(rc)}" if rc is not None and rc < 0 else
                       f"exited with status {rc}" if rc is not None else
                       f"broke the protocol ({outcome.get('detail', 'no reply')})")
                message = f"{where}: candidate process {how} while {_describe(outcome['stage'])}"
                if tail:
                    message += f"; last output: {tail}"
                outcome = {**outcome, "kind": "crash", "message": message}
            else:
                htail, _ = _log_tail(tmp / "harness.log", self.private, display)
                rc = _status(harness)
                outcome = {**outcome, "kind": "crash", "harness_error": True,
                           "message": f"evaluator harness died (status {rc}) while {_describe(outcome['stage'])}"
                                      + (f": {htail}" if htail else "")}
        return outcome


def _base(task: "Task", path: Path, sha: str, device: str, seeds: int) -> dict[str, Any]:
    return {
        "task": task.name,
        "file": str(path),
        "sha256": sha,
        "device": "cpu-interpret" if device == "cpu" else "cuda",
        "verdict": "crash",
        "message": "",
        "shapes": [],
        "speedup": None,
        "timing_comparable": device == "cuda",
        "baseline": None,
        "seeds": seeds,
    }


def evaluate(
    task: "Task",
    file: Path | str,
    *,
    device: str = "auto",
    heldout: bool = False,
    timeout_s: float | None = None,
    seeds: int = 3,
    static_guards: bool = True,
    prestarter: Prestarter | None = None,
    graph: bool | None = None,
) -> dict[str, Any]:
    """Evaluate one candidate file against a task.

    Args:
        task: the loaded task (its shapes, tolerance, forbidden lists, reference and baseline).
        file: the candidate: one Python file defining the task's entry function.
        device: "cuda", "cpu" (Triton interpreter, small shapes) or "auto" (cuda when a GPU looks present).
        heldout: also run the held-out shapes, reported under "heldout".
        timeout_s: wall-clock limit for the whole evaluation; default 300 s on CPU, 600 s on CUDA.
        seeds: input seeds per shape (each seed also picks an input distribution).
        static_guards: False skips the static source checks, so that the self-test can prove the run-time guards
            catch on their own what the static ones would have; every real evaluation keeps them.
        prestarter: takes a process pair it started earlier (skipping their start-up), and starts the next one
            once this evaluation's processes are gone; long-running callers (the agent runtime) pass one.
        graph: also time both sides under CUDA graphs (graph_ms, baseline_graph_ms, graph_speedup per shape);
            None takes the task's graph_timing. Ignored on the CPU.

    Returns:
        The evaluator contract dict (task, file, sha256, device, verdict, message, shapes, speedup,
        timing_comparable) plus baseline, seeds, heldout, timing, env, warnings, findings, quarantined,
        profile (CUDA: kernel table, roofline class and advice per shape), phases_s and elapsed_s.

    Raises:
        EvalUsageError: a missing file, an unknown device, CUDA asked for but unavailable, or bad arguments.
    """
    started = time.monotonic()
    path = Path(file).absolute()
    if not path.is_file():
        raise EvalUsageError(f"candidate file not found: {file}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise EvalUsageError(f"seeds must be a positive integer, got {seeds!r}")
    if timeout_s is not None and not timeout_s > 0:
        raise EvalUsageError(f"timeout_s must be positive, got {timeout_s!r}")
    try:
        dev = resolve_device(device)
    except DeviceError as exc:
        raise EvalUsageError(str(exc)) from None
    data = path.read_bytes()
    result = _base(task, path, hashlib.sha256(data).hexdigest(), dev, seeds)

    def done(verdict: str, message: str, **extra: Any) -> dict[str, Any]:
        result.update(verdict=verdict, message=message, **extra)
        result["elapsed_s"] = round(time.monotonic() - started, 3)
        return verdicts.clean(result)

    try:
        source = data.decode("utf-8")
        tree = ast.parse(source, filename=str(path))
    except UnicodeDecodeError as exc:
        return done("compile_error", f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})")
    except SyntaxError as exc:
        return done("compile_error", f"{path}:{exc.lineno}: SyntaxError: {exc.msg}")
    findings = check_static(task, source, str(path), tree=tree) if static_guards else []
    if not static_guards:
        result["static_guards"] = False
    if findings:
        first = findings[0]
        more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
        return done("forbidden", f"{path}:{first.line}: {first.message}{more}",
                    findings=[f.to_dict() for f in findings])

    timeout = float(timeout_s) if timeout_s is not None else DEFAULT_TIMEOUT_S[dev]
    use_graph = task.graph_timing if graph is None else bool(graph)
    run = _Run(task, path, data, dev, heldout, seeds, timeout, jit_functions(tree), graph=use_graph and dev == "cuda")
    try:
        outcome = run.execute(prestarter)
    finally:
        if prestarter is not None:
            prestarter.replenish(dev)
    result["prestarted"] = run.prestarted
    if getattr(run, "kept_dir", None):
        result["logs_dir"] = run.kept_dir
    kind = outcome["kind"]
    if outcome.get("env"):
        result["env"] = outcome["env"]
        if dev == "cuda" and outcome["env"].get("gpu"):
            result["device"] = f"cuda:{outcome['env']['gpu']}"
    result["baseline"] = outcome.get("baseline")
    result["phases_s"] = outcome.get("phases", {})
    if kind == "usage_error":
        raise EvalUsageError(outcome["message"])
    if kind == "timeout":
        which = "the evaluation limit" if outcome["overall"] else "the stage limit"
        return done("timeout", f"{path}: no answer after {outcome['elapsed']:.1f} s ({which} is "
                               f"{outcome['limit']:g} s) while {_describe(outcome['stage'])}")
    if kind == "crash":
        extra = {"harness_error": True} if outcome.get("harness_error") else {}
        return done("crash", outcome["message"], **extra)
    if kind == "harness_error":
        return done("crash", f"evaluator harness error while {_describe(outcome['stage'])}: {outcome['message']}",
                    harness_error=True, traceback=outcome.get("traceback"))

    rows = outcome["rows"]
    gpu = (outcome.get("env") or {}).get("gpu")
    public = [r for r in rows if r.get("role") == "public"]
    hidden = [r for r in rows if r.get("role") == "heldout"]
    result["shapes"] = [verdicts.shape_entry(r, task, dev, gpu) for r in public]
    if heldout:
        result["heldout"] = [verdicts.shape_entry(r, task, dev, gpu) for r in hidden]
    verdict, message, warnings = verdicts.judge(task, dev, rows, outcome["failure"], outcome["baseline"], gpu)
    timed = all(e["speedup"] is not None for e in result["shapes"]) and result["shapes"]
    result["speedup"] = verdicts.geomean([e["speedup"] for e in result["shapes"]]) if timed else None
    if heldout and result["heldout"] and all(e["speedup"] is not None for e in result["heldout"]):
        result["heldout_speedup"] = verdicts.geomean([e["speedup"] for e in result["heldout"]])
    result["timing"] = outcome.get("timing")
    result["warnings"] = list(outcome.get("warnings", [])) + warnings
    reason = verdicts.quarantine(task, dev, verdict, rows, gpu)
    result["quarantined"] = reason is not None
    if reason:
        result["quarantine_reason"] = reason
    if dev == "cuda" and any(r.get("ms") is not None for r in public):
        from workbench.profiler import summary

        sms = (outcome.get("env") or {}).get("sms")
        result["profile"] = summary.build(task, public, outcome.get("compile") or [], sms, gpu)
    if verdict == "ok":
        n = len(public) + (len(hidden) if heldout else 0)
        message = f"correct on {n} shapes x {seeds} seeds"
        if result["speedup"] is not None:
            message += f"; speedup {result['speedup']:.3g}x vs {outcome['baseline']} (geomean)"
        if dev == "cpu":
            message += "; interpreter timings are not comparable"
    return done(verdict, message)
