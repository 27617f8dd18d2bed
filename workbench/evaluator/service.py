"""EvaluationService: one long-lived trusted evaluation process per device, fresh candidate processes per call.

The object lives in the caller's process (the CLI, the agent runtime, a scheduler slot) and never imports torch.
It owns every process and pipe: the service process (workbench.evaluator.harness), which keeps the task's reference
and baseline, the oracle's outputs and the timer across evaluations, and one pre-started candidate process
(workbench.evaluator.worker) per evaluation, whose pipe ends it hands to the service. It enforces every time limit:
each step the service announces carries its limit and whose step it is; a candidate step that runs over is the
candidate's timeout (its process group is killed, the service carries on), a trusted step that runs over, or a
service that dies or reports a fault, gets the service restarted and the evaluation run once more, and a second
failure is an EvalServiceError.

    with EvaluationService(task, "cuda", gpu=0) as service:
        result = service.evaluate("kernels/kda/kda_chunked.py")
        check = service.evaluate("kernels/kda/kda_chunked.py", heldout=True)
        print(service.health())
"""

from __future__ import annotations

import collections
import json
import os
import select
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.devices import DeviceError, resolve_device
from workbench.evaluator import assemble, crashes, isolation, limits, scratch, tether, wire
from workbench.evaluator.assemble import Outcome
from workbench.evaluator.errors import EvalAborted, EvalServiceError, EvalUsageError
from workbench.evaluator.forked import ForkedChild
from workbench.evaluator.prestart import Prestarter, WorkerProcess, kill_group, status
from workbench.evaluator.submission import submit

if TYPE_CHECKING:
    from workbench.evaluator.result import EvalResult
    from workbench.tasks import Task

DEFAULT_TIMEOUT_S = {"cpu": 300.0, "cuda": 600.0}
"""Candidate time an evaluation may take before the service has announced its own limit."""
CACHE_BYTES = {"cuda": 16 << 30, "cpu": 1 << 30}
"""Default memory for the service's oracle outputs and prepared timing sets."""
LOST_WAIT_S = 5.0
"""How long a candidate process that dropped its pipe gets to finish dying, so its exit status can name the signal."""
FRAME_LIMIT = 64 << 20
KEEP_ENV = "WORKBENCH_EVAL_KEEP"
"""Set (to anything) to keep each evaluation's private folder, with the candidate's log, for debugging."""
_FINAL = ("result", "worker_lost", "harness_error", "fault")


@dataclass(frozen=True)
class Fault:
    """Something that went wrong on the trusted side."""

    kind: str
    """"died", "hung", "baseline", "oracle", "harness_error", "unresponsive" or "start"."""
    message: str
    at: float = field(default_factory=time.time)
    evaluation: int | None = None
    """The evaluation it happened in (None: between evaluations)."""


@dataclass
class ServiceHealth:
    """How a service is doing: what a scheduler needs to keep or retire a slot."""

    device: str
    gpu: str | None
    cpus: list[int]
    alive: bool
    pid: int | None
    evaluations: int
    restarts: int
    faults: list[Fault]
    prestarted: int
    """Evaluations that found their candidate process already started."""
    baseline: str | None
    netns: bool | None
    """Whether the last candidate process ran in a network namespace of its own (None: none ran yet)."""
    template: str
    """How candidate processes start: "forked from template PID", "off", or why they are fresh interpreters."""
    cache: dict[str, int]


class _Died(Exception):
    """The service process closed its pipe."""


def oracle_hash(task: "Task") -> str:
    """The task's oracle hash (workbench.tasks.hashing: task.toml, reference, baseline and what they import): the
    oracle cache's key, and what restarts the service when it changes."""
    from workbench.tasks.hashing import task_hash

    return task_hash(task.dir)["sha256"]


def usable_cpus() -> list[int]:
    """The CPUs this process may use (empty where the OS does not say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def timing_cpus(cpus: Sequence[int] | None, gpu: str | int | None) -> list[int]:
    """The two CPUs an evaluation times on (the service's, the candidate process's).

    Explicit cpus win; otherwise two of the CPUs this process may use, chosen by the GPU's index, so services for
    GPU 0, 1, ... on one host time on distinct cores (while cores last).
    """
    if cpus:
        chosen = [int(c) for c in cpus]
        return (chosen * 2)[:2] if len(chosen) < 2 else chosen[:2]
    allowed = usable_cpus()
    if not allowed:
        return []
    index = int(gpu) if isinstance(gpu, int) or (isinstance(gpu, str) and gpu.isdigit()) else 0
    n = len(allowed)
    return [allowed[(2 * index) % n], allowed[(2 * index + 1) % n]]


class _ServiceProcess:
    """The service process, its message pipe (in) and its request socket (out)."""

    def __init__(self, config: dict[str, Any], device: str, gpu: str | None, cpus: set[int] | None = None):
        self.tmp = scratch.make("service")
        self.log = self.tmp / "service.log"
        msg_r, msg_w = os.pipe()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = isolation.trusted_env()
        env["PYTHONUNBUFFERED"], env["PYTHONFAULTHANDLER"] = "1", "1"
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""
        else:
            env.pop("TRITON_INTERPRET", None)
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        try:
            with self.log.open("wb") as out:
                self.proc = subprocess.Popen(
                    tether.python_argv("workbench.evaluator.harness", device), stdin=subprocess.PIPE,
                    stdout=out, stderr=subprocess.STDOUT, pass_fds=(msg_w, theirs.fileno()), cwd=self.tmp, env=env,
                    start_new_session=True)  # its own group (killed on close), and it dies with us (tether)
        except BaseException:
            for fd in (msg_r, msg_w):
                os.close(fd)
            ours.close()
            theirs.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        if cpus:
            try:  # before it imports anything: its threads and children (precompiles) inherit the mask
                os.sched_setaffinity(self.proc.pid, cpus)
            except (AttributeError, OSError):
                pass
        cfg = {**config, "fd_parent": msg_w, "fd_requests": theirs.fileno()}
        try:
            self.proc.stdin.write(json.dumps(cfg).encode())  # type: ignore[union-attr]
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass  # it died at once: its pipe says so
        os.close(msg_w)
        theirs.close()
        self.pipe = msg_r
        self.sock = ours
        self.reader = wire.FrameReader(FRAME_LIMIT)
        self.pending: collections.deque[dict[str, Any]] = collections.deque()
        self.ready = False
        self.baseline: str | None = None
        self.env: dict[str, Any] = {}
        self.dead = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def read(self, deadline: float | None) -> dict[str, Any] | None:
        """The next message, or None when the deadline (monotonic; None: wait forever) passes first.

        Raises:
            _Died: the service closed its pipe (it exited or was killed).
        """
        while not self.pending:
            if self.dead:
                raise _Died()
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.pipe], [], [], timeout)
            if not ready:
                return None
            data = os.read(self.pipe, 1 << 16)
            if not data:
                self.dead = True
                raise _Died()
            try:
                frames = self.reader.feed(data)
            except wire.WireError:
                self.dead = True
                raise _Died() from None
            for frame in frames:
                try:
                    msg = json.loads(frame)
                except ValueError:
                    continue
                if msg.get("type") == "ready":
                    self.ready, self.baseline = True, msg.get("baseline")
                elif msg.get("type") == "env":
                    self.env = msg.get("env") or {}
                self.pending.append(msg)
        return self.pending.popleft()

    def send(self, request: dict[str, Any], fds: Sequence[int]) -> None:
        """One request with the pipe ends it needs (SCM_RIGHTS); a dead service shows up on the next read."""
        try:
            socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds))
        except OSError:
            self.dead = True

    def log_tail(self) -> str:
        tail, _ = crashes.log_tail(self.log, "", "")
        return tail

    def close(self, *, kill: bool) -> None:
        if not kill and self.alive() and self.ready:  # before ready it reads no requests: nothing to ask
            try:
                self.sock.send(json.dumps({"op": "exit"}).encode())
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        kill_group(self.proc)
        self.sock.close()
        try:
            os.close(self.pipe)
        except OSError:
            pass
        self.dead = True
        shutil.rmtree(self.tmp, ignore_errors=True)


class EvaluationService:
    """A trusted evaluation service for one task on one device, for a whole run.

    Args:
        task: the loaded task.
        device: "cuda", "cpu" (Triton interpreter, small shapes) or "auto".
        gpu: the GPU this service uses (CUDA_VISIBLE_DEVICES for it and its candidate processes); None keeps the
            caller's visible devices.
        cpus: the two CPUs timing runs on (service, candidate); default: two of this process's, by GPU index.
        seeds: correctness seeds per shape (each evaluation checks all of them).
        secret_seeds: draw seeds from os.urandom (False: seeds 0..seeds-1, for reproducible comparisons).
        fresh_sets: timing input sets per shape per evaluation, each drawn for that evaluation alone.
        refresh_every: evaluations between refreshes of each shape's seed pool.
        precision: time until the speedup's 95% interval is within this relative half-width.
        cache_bytes: memory for oracle outputs and prepared timing sets (default 16 GiB on CUDA, 1 GiB on CPU).
        prestart: keep a candidate process started ahead of the next evaluation.
        prepare_heldout: also prepare the held-out shapes between evaluations (baseline warm-up, oracle outputs).
        spare_cpus: the CPUs a waiting candidate process imports on; default: this process's CPUs other than the
            timing ones. Several services on one host (workbench.fleet) pass the CPUs none of them times on; the
            service process is then kept to its timing CPUs and these.

    Raises:
        EvalUsageError: an unknown device.
    """

    def __init__(self, task: "Task", device: str = "auto", *, gpu: str | int | None = None,
                 cpus: Sequence[int] | None = None, seeds: int = 3, secret_seeds: bool = True, fresh_sets: int = 2,
                 refresh_every: int = 8, precision: float = 0.01, cache_bytes: int | None = None,
                 prestart: bool = True, prepare_heldout: bool = True,
                 spare_cpus: Sequence[int] | None = None) -> None:
        if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
            raise EvalUsageError(f"seeds must be a positive integer, got {seeds!r}")
        if fresh_sets < 2:
            raise EvalUsageError(f"fresh_sets must be at least 2 (timed reps alternate sets), got {fresh_sets!r}")
        try:
            self.device = resolve_device(device)
        except DeviceError as exc:
            raise EvalUsageError(str(exc)) from None
        self.task = task
        self.gpu = None if gpu is None else str(gpu)
        self.cpus = timing_cpus(cpus, gpu)
        self.seeds = seeds
        self._config = {
            "task": task.name, "reference": str(task.reference),
            "baseline": str(task.baseline) if task.baseline else None, "entry": task.entry,
            "outputs": list(task.outputs), "tols": [task.tol(o) for o in task.outputs], "device": self.device,
            "task_hash": oracle_hash(task), "groups": self._groups(), "seeds": seeds,
            "secret": secret_seeds, "fresh_sets": fresh_sets, "refresh_every": refresh_every,
            "precision": precision, "cache_bytes": cache_bytes or CACHE_BYTES[self.device], "cpus": self.cpus,
            "prepare_heldout": prepare_heldout,
        }
        self._lock = threading.Lock()
        """One evaluation at a time per service (a slot of the scheduler is one service)."""
        self._proc: _ServiceProcess | None = None
        self._closed = False
        self._count = 0
        self.restarts = 0
        self.faults: list[Fault] = []
        self._last: dict[str, Any] = {}
        """The last result's service-side figures (cache, isolation), for health()."""
        self._worker: WorkerProcess | None = None
        """The candidate process of the evaluation in flight (for abort())."""
        self._aborted = False
        """Set by abort() while an evaluation is in flight; evaluate() then raises EvalAborted."""
        spare = set(spare_cpus) if spare_cpus is not None else set(usable_cpus()) - set(self.cpus)
        self._affinity = (set(self.cpus) | spare) if spare_cpus is not None else None
        """Where the service process runs when a pool shares the host out (its timing CPUs and the spare ones, never
        another service's timing CPUs); None: anywhere."""
        self._prestarter = Prestarter(self.device, cpus=spare or None, netns=isolation.netns_wanted(),
                                      gpu=self.gpu) if prestart else None
        scratch.sweep_once()  # what killed runs on this machine left behind (their owners cannot)
        self._start()
        self._replenish(warm=True)

    # -- set-up ----------------------------------------------------------------------------------------------

    def _groups(self) -> list[dict[str, Any]]:
        public, hidden = ("cuda", "heldout") if self.device == "cuda" else ("cpu", "heldout_cpu")
        return [{"group": public, "role": "public", "shapes": [s.to_dict() for s in self.task.shapes[public]]},
                {"group": hidden, "role": "heldout", "shapes": [s.to_dict() for s in self.task.shapes[hidden]]}]

    def _start(self) -> None:
        self._proc = _ServiceProcess(self._config, self.device, self.gpu, self._affinity)

    def _restart(self) -> None:
        if self._proc is not None:
            self._proc.close(kill=True)
        if self._closed:
            return  # closed from another thread meanwhile: nothing may outlive close()
        self.restarts += 1
        self._start()

    def _ensure_ready(self) -> None:
        """A started service that has said ready: restarted when the task's files changed or it died.

        Raises:
            EvalUsageError: the service refused the task or the device (a usage error, as it said).
            EvalServiceError: the service failed to start twice.
        """
        digest = oracle_hash(self.task)
        if digest != self._config["task_hash"]:
            self._config["task_hash"] = digest  # a changed reference or baseline: start over, caches and all
            self._restart()
        for attempt in (1, 2):
            assert self._proc is not None
            if not self._proc.alive():
                self._restart()
            deadline = time.monotonic() + limits.TRUSTED_S["service"]
            try:
                while not self._proc.ready:
                    msg = self._proc.read(deadline)
                    if msg is None or msg.get("type") == "harness_error":
                        raise _Died()
                    if msg.get("type") == "usage_error":
                        self._proc.close(kill=True)
                        raise EvalUsageError(str(msg.get("message")))
                return
            except _Died:
                if self._aborted:
                    raise EvalAborted("the evaluation was aborted while the service started") from None
                fault = Fault("start", f"the evaluation service did not start: {self._proc.log_tail() or 'no output'}")
                self.faults.append(fault)
                if attempt == 2:
                    self._proc.close(kill=True)
                    raise EvalServiceError(fault.message) from None
                self._restart()

    # -- evaluations ----------------------------------------------------------------------------------------

    def evaluate(self, path: Path | str, *, heldout: bool = False, graph: bool | None = None,
                 static_guards: bool = True, timeout_s: float | None = None,
                 on_stage: Callable[[dict[str, Any]], None] | None = None) -> "EvalResult":
        """Evaluate one candidate file: static checks here, the rest in the service and a fresh candidate process.

        Args:
            path: the candidate: one Python file defining the task's entry function.
            heldout: also run the held-out shapes, reported under "heldout".
            graph: also time both sides as CUDA-graph replays; None takes the task's graph_timing (CUDA only).
            static_guards: False skips the static source checks (the self-test's run-time-guard cases only).
            timeout_s: a wall-clock limit of the caller's for the whole evaluation (the limits derived from the
                task's timing apply either way).
            on_stage: called with each step the service announces ({"stage", "trusted", "shape", ...}), for
                progress displays, the preparation this evaluation waits behind included (a cold baseline's
                precompile and warm-up); it runs on this thread and must not block.

        Returns:
            The evaluator contract result (EvalResult).

        Raises:
            EvalUsageError: a missing file, bad arguments, or a task or device the service cannot use.
            EvalServiceError: the service failed twice on this evaluation (restarted in between).
            EvalAborted: abort() stopped it.
        """
        if timeout_s is not None and not timeout_s > 0:
            raise EvalUsageError(f"timeout_s must be positive, got {timeout_s!r}")
        if self._closed:
            raise EvalUsageError("this evaluation service is closed")
        sub = submit(self.task, path, self.device, self.seeds, static_guards=static_guards)
        if sub.early is not None:
            return sub.early  # type: ignore[return-value]
        use_graph = (self.task.graph_timing if graph is None else bool(graph)) and self.device == "cuda"
        with self._lock:
            self._aborted = False
            failures: list[Fault] = []
            for _ in (1, 2):
                self._count += 1
                outcome = self._run(sub, heldout, use_graph, timeout_s, on_stage, self._count)
                if self._aborted:
                    raise EvalAborted(f"the evaluation of {sub.path.name} was aborted")
                if isinstance(outcome, Fault):
                    failures.append(outcome)
                    self.faults.append(outcome)
                    self._restart()
                    continue
                service = {"evaluations": self._count, "restarts": self.restarts, "pid": self._proc.pid,
                           "reruns": len(failures)} if self._proc else {}
                result = assemble.build(self.task, sub, self.device, self.seeds, heldout, outcome, service)
                self._last = {"cache": dict(result.get("cache") or {}), "netns": outcome.worker.get("netns")}
                return result
        raise EvalServiceError(f"the evaluation service failed twice on {sub.path.name}: "
                               f"{failures[0].kind}: {failures[0].message}; then {failures[1].kind}: "
                               f"{failures[1].message}")

    def _take_worker(self) -> tuple[WorkerProcess, bool]:
        if self._prestarter is None:
            return WorkerProcess(self.device, netns=isolation.netns_wanted(), gpu=self.gpu), False
        hits = self._prestarter.hits
        worker = self._prestarter.take()
        return worker, self._prestarter.hits > hits

    def _run(self, sub: Any, heldout: bool, use_graph: bool, timeout_s: float | None,
             on_stage: Callable[[dict[str, Any]], None] | None, eval_id: int) -> Outcome | Fault:
        """One attempt: a candidate process, the request, the watch. A Fault when the trusted side failed.

        The candidate process is taken (or started) before waiting for the service, so a cold start of both
        overlaps.
        """
        worker, prestarted = self._take_worker()
        self._worker = worker
        keep = bool(os.environ.get(KEEP_ENV))
        try:
            self._ensure_ready()
            proc = self._proc
            assert proc is not None
            private = worker.cand_dir / sub.path.name
            private.write_bytes(sub.data)
            worker.configure(json.dumps({
                "candidate": str(private), "display": str(sub.path), "entry": self.task.entry,
                "device": self.device, "forbidden_imports": list(self.task.forbidden_imports),
                "max_frame": 1 << 28, "reference": str(self.task.reference), "task_dir": str(self.task.dir),
                "slab_in": str(worker.slabs / "to_worker.slab"), "slab_out": str(worker.slabs / "to_service.slab"),
                "cpu": self.cpus[1] if len(self.cpus) > 1 else None,
            }).encode())
            assert worker.service_fds is not None
            proc.send({"op": "evaluate", "id": eval_id, "display": str(sub.path), "candidate": str(private),
                       "jit_names": sub.jit_names, "heldout": heldout, "graph": use_graph,
                       "slab_to_worker": str(worker.slabs / "to_worker.slab"),
                       "slab_to_service": str(worker.slabs / "to_service.slab")}, worker.service_fds)
            worker.release_service_fds()
            # The next candidate process imports while this evaluation runs (its CPUs are not the timing ones);
            # it touches the GPU only once timing is over (warm, from the watch), at once on the CPU.
            self._replenish(warm=self.device == "cpu")
            watch = _Watch(self, proc, worker, sub, eval_id, timeout_s, on_stage)
            outcome = watch.run()
            if isinstance(outcome, Outcome):
                outcome.prestarted = prestarted
                outcome.start = worker.start_note
                if keep:
                    outcome.logs_dir = str(worker.tmp)
            return outcome
        finally:
            self._worker = None
            worker.discard(keep_dir=keep)
            self._replenish(warm=True)

    def _replenish(self, *, warm: bool) -> None:
        """Have a candidate process waiting for the next evaluation; warm: let it touch the GPU now."""
        if self._prestarter is None or self._closed:
            return
        try:
            self._prestarter.replenish()
        except OSError:
            return  # no processes to spare now: the next evaluation starts its own
        if warm:
            self._prestarter.warm()

    # -- reporting and shutdown -----------------------------------------------------------------------------

    def health(self) -> ServiceHealth:
        """How the service is doing (no process is contacted)."""
        proc = self._proc
        return ServiceHealth(
            device=self.device, gpu=self.gpu, cpus=list(self.cpus), alive=bool(proc and proc.alive()),
            pid=proc.pid if proc else None, evaluations=self._count, restarts=self.restarts,
            faults=list(self.faults), prestarted=self._prestarter.hits if self._prestarter else 0,
            baseline=proc.baseline if proc else None, netns=self._last.get("netns"),
            template=self._template_status(),
            cache=dict(self._last.get("cache") or {}))

    def _template_status(self) -> str:
        if self._prestarter is None:
            return "off (no pre-started processes)"
        template = self._prestarter.template
        if template is not None and template.alive():
            return f"forked from template {template.pid}"
        return self._prestarter.template_note

    def abort(self) -> None:
        """Stop the evaluation in flight, from another thread (the run is stopping): its candidate process and the
        service process are killed, and evaluate() raises EvalAborted at once; the next evaluation starts the
        service again. Nothing happens when no evaluation is in flight."""
        if not self._lock.locked():
            return
        self._aborted = True
        proc, worker = self._proc, self._worker
        if proc is not None:
            kill_group(proc.proc)  # the watch then reads the end of its pipe: no fd is closed under it
        if worker is not None and worker.proc is not None:
            kill_group(worker.proc)

    def close(self) -> None:
        """Stop the service and any waiting candidate process (aborting an evaluation in flight); the object
        cannot evaluate afterwards."""
        self._closed = True
        self.abort()
        held = self._lock.acquire(timeout=limits.ABORT_S + LOST_WAIT_S)  # the aborted evaluation lets go first
        try:
            if self._prestarter is not None:
                self._prestarter.close()
            if self._proc is not None:
                self._proc.close(kill=False)
        finally:
            if held:
                self._lock.release()

    def __enter__(self) -> "EvaluationService":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Watch:
    """Reads one evaluation's messages and enforces its limits; decides how it ended."""

    def __init__(self, owner: EvaluationService, proc: _ServiceProcess, worker: WorkerProcess, sub: Any,
                 eval_id: int, timeout_s: float | None, on_stage: Callable[[dict[str, Any]], None] | None):
        self.owner, self.proc, self.worker, self.sub = owner, proc, worker, sub
        self.eval_id = eval_id
        self.on_stage = on_stage
        self.started = time.monotonic()
        self.wall_deadline = None if timeout_s is None else self.started + timeout_s
        self.stage: dict[str, Any] = {"stage": "idle", "trusted": True}
        self.stage_deadline: float | None = None
        self.stage_budget = 0.0
        self.stage_t = self.started
        """When the service announced the current step (its clock: CLOCK_MONOTONIC, shared by the host)."""
        self.stage_since = self.started
        self.candidate_s = 0.0
        """Time spent in the candidate's steps so far (the evaluation limit counts only those)."""
        self.limit_s = DEFAULT_TIMEOUT_S[owner.device]
        self.phases: dict[str, float] = {}
        self.worker_info: dict[str, Any] = {}
        self.replenished = False
        self._waiting: dict[str, Any] | None = None
        """The service's own step (stamped with no evaluation) last read, until shown or superseded."""

    def _mark(self, now: float) -> None:
        name = self.stage.get("stage", "idle")
        spent = now - self.stage_since
        self.phases[name] = round(self.phases.get(name, 0.0) + spent, 3)
        if not self.stage.get("trusted"):
            self.candidate_s += spent
        self.stage_since = now

    def _deadline(self, now: float) -> tuple[float | None, str]:
        """The earliest deadline and which limit it is."""
        found: list[tuple[float, str]] = []
        if self.stage_deadline is not None:
            found.append((self.stage_deadline, "stage"))
        if not self.stage.get("trusted"):
            found.append((now + self.limit_s - self.candidate_s - (now - self.stage_since), "evaluation"))
        if self.wall_deadline is not None:
            found.append((self.wall_deadline, "caller"))
        if not found:
            return None, ""
        return min(found)

    def run(self) -> Outcome | Fault:
        while True:
            now = time.monotonic()
            deadline, which = self._deadline(now)
            try:
                if deadline is not None and now >= deadline:
                    # A trusted step that looks late may be an old announcement: the service's preparation between
                    # evaluations is announced with no reader, so its steps wait in the pipe, stamped with when
                    # they began. Only a message queued behind one can say it ended; nothing queued, it is late.
                    msg = self.proc.read(now) if which == "stage" and self.stage.get("trusted") else None
                    if msg is None:
                        return self._expired(which, now)
                else:
                    msg = self.proc.read(now)
                    if msg is None:
                        self._show_waiting()
                        msg = self.proc.read(deadline)
            except _Died:
                return Fault("died", f"the evaluation service died while {crashes.describe(self.stage)}"
                             + (f": {self.proc.log_tail()}" if self.proc.log_tail() else ""), evaluation=self.eval_id)
            if msg is None:
                continue
            kind = msg.get("type")
            if msg.get("eval") not in (None, self.eval_id):
                continue  # the tail of an earlier evaluation that was aborted
            if kind == "stage":
                self._mark(time.monotonic())
                self.stage = {k: v for k, v in msg.items() if k not in ("type", "eval", "t", "budget_s")}
                budget = msg.get("budget_s")
                self.stage_t = float(msg["t"])
                self.stage_budget = float(budget) if budget is not None else 0.0
                self.stage_deadline = None if budget is None else self.stage_t + float(budget)
                if msg.get("eval") == self.eval_id:
                    self._waiting = None
                    if self.on_stage is not None:
                        self.on_stage(dict(self.stage))
                else:
                    self._waiting = None if self.stage.get("stage") == "idle" else dict(self.stage)
                if self.stage.get("stage") == "profile" and not self.replenished:
                    # Timing is over: the next candidate process may create its context and launch now. Earlier
                    # (at the first correctness call) it disturbed the next shape's timing on the H200: MLA M1's
                    # launch-bound baseline went from +-1.4% to +-60% (2026-12-01).
                    self.replenished = True
                    self.owner._replenish(warm=True)
            elif kind == "limits":
                self.limit_s = float(msg["evaluation_s"])
            elif kind == "fault" and msg.get("idle"):
                self.owner.faults.append(Fault(str(msg.get("kind")), str(msg.get("message")), evaluation=None))
            elif kind in _FINAL and msg.get("eval") == self.eval_id:
                self._mark(time.monotonic())
                return self._final(msg)

    def _show_waiting(self) -> None:
        """Show the preparation step this evaluation waits behind (a baseline's warm-up, its precompile, an oracle
        output), once nothing is queued after it: then it is the step under way, not an old one from idle time."""
        if self._waiting is not None and self.on_stage is not None:
            self.on_stage(self._waiting)
        self._waiting = None

    def _expired(self, which: str, now: float) -> Outcome | Fault:
        """A limit passed: the candidate's timeout, or a hung service."""
        self._mark(now)
        budget = f"{self.stage_budget:g} s"
        if self.stage.get("trusted") and which == "stage":
            return Fault("hung", f"the evaluation service ran past its {budget} limit while "
                         f"{crashes.describe(self.stage)}", evaluation=self.eval_id)
        kill_group(self.worker.proc)  # type: ignore[arg-type]
        if which == "stage":
            elapsed, name, limit = now - self.stage_t, "the step's limit", budget
        elif which == "evaluation":
            elapsed, name, limit = self.candidate_s, "the evaluation limit", f"{self.limit_s:g} s of candidate time"
        else:
            elapsed, name = now - self.started, "the caller's limit"
            limit = f"{(self.wall_deadline or now) - self.started:g} s"
        message = (f"{self.sub.path}: no answer after {elapsed:.1f} s ({name} is {limit}) while "
                   f"{crashes.describe(self.stage)}")
        self._drain()
        return Outcome("timeout", message=message, stage=dict(self.stage), env=self.proc.env, phases=self.phases,
                       worker=self.worker_info)

    def _drain(self) -> None:
        """After killing the candidate process: wait for the service to let go of this evaluation, or restart it."""
        end = time.monotonic() + limits.ABORT_S
        while True:
            try:
                msg = self.proc.read(end)
            except _Died:
                return  # the next evaluation restarts it
            if msg is None:
                self.owner.faults.append(Fault("unresponsive", "the evaluation service did not let go of a timed-out "
                                               "candidate; restarted", evaluation=self.eval_id))
                self.owner._restart()
                return
            if msg.get("eval") == self.eval_id and msg.get("type") in _FINAL:
                if msg.get("healthy") is False:
                    self.owner._restart()
                return

    def _final(self, msg: dict[str, Any]) -> Outcome | Fault:
        kind = msg["type"]
        env = msg.get("env") or self.proc.env
        if kind == "result":
            self.worker_info = msg.get("worker") or {}
            if msg.get("healthy") is False:
                self.owner.faults.append(Fault("unhealthy", "the service's GPU context failed its health check after "
                                               "a candidate process faulted; restarted", evaluation=self.eval_id))
                self.owner._restart()
            return Outcome("result", final=msg, stage=self.stage, env=env, phases=self.phases,
                           worker=self.worker_info)
        if kind == "fault":
            return Fault(str(msg.get("kind")), str(msg.get("message")), evaluation=self.eval_id)
        if kind == "harness_error":
            return Fault("harness_error", f"{msg.get('message')} while {crashes.describe(msg.get('stage') or {})}",
                         evaluation=self.eval_id)
        # worker_lost: the candidate process died or broke the protocol.
        proc = self.worker.proc
        assert proc is not None
        end = time.monotonic() + LOST_WAIT_S
        while time.monotonic() < end and status(proc) is None:
            time.sleep(0.02)
        rc = status(proc)
        stage = msg.get("stage") or self.stage
        message = crashes.worker_death(rc if rc not in (None, 0) else None, stage, str(self.sub.path), self.worker.log,
                                       str(self.worker.cand_dir / self.sub.path.name), str(msg.get("detail", "")))
        if isinstance(proc, ForkedChild) and proc.template_lost:
            message += "; its template process died first and took it along"
        if msg.get("healthy") is False:
            self.owner.faults.append(Fault("unhealthy", "the service's GPU context failed its health check after a "
                                           "candidate process faulted; restarted", evaluation=self.eval_id))
            self.owner._restart()
        return Outcome("crash", message=message, stage=stage, env=env, phases=self.phases, worker=self.worker_info)
