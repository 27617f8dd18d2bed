"""Candidate processes started ahead of need, so an evaluation does not wait for a torch import.

Every candidate runs in a fresh worker process. Most of a worker's start-up (interpreter, torch, triton, the CUDA
context, Triton's first launch) depends only on the device, so a worker can be started before anyone knows which
candidate it will run: it isolates itself, imports and warms up, says "ready" on its reply pipe, then blocks
reading its configuration on stdin. An evaluation takes a ready worker, writes the configuration, and the worker
serves that evaluation only. Nothing of one candidate can reach the next, since no worker outlives its evaluation.

A `Prestarter` keeps one such worker per evaluation service. The service starts the next one as soon as the current
evaluation has its own (`replenish`): it imports on CPUs the timing processes do not use and touches no GPU until
told (`warm`), which the service does once the current evaluation's timing is over (a context created during a
timed block disturbs it). A worker left unused exits when its stdin closes (the owner closes it, or dies).

Where the OS allows, a worker is not a fresh interpreter but a child forked from the Prestarter's template
(workbench.evaluator.forked), which has done the isolation and imports once: the child then does what a fresh
worker does from "imported" on. A template that cannot start or dies is restarted (up to TEMPLATE_RESTARTS times),
and meanwhile, or after that, workers start as fresh interpreters; each worker says which it is (start_note).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path

from workbench.evaluator import isolation, scratch, tether, wire
from workbench.evaluator.forked import ForkedChild, Template, TemplateError, templates_wanted

WARM_LINE = b"warm"
"""What the owner writes on a waiting worker's stdin to have it touch the GPU now (context, Triton's first launch)."""
SHM_DIR = "/dev/shm"
SHM_MIN_FREE = 4 << 30
"""The tensor slabs go to shared memory when it has this much room (a container's default /dev/shm is 64 MB);
otherwise they live in the evaluation's private folder, which the page cache serves nearly as fast."""
TEMPLATE_RESTARTS = 3
"""Templates a Prestarter starts again after one died or failed; then its workers are fresh interpreters."""


def _slab_dir(tmp: Path) -> Path:
    try:
        st = os.statvfs(SHM_DIR)
        if st.f_bavail * st.f_frsize >= SHM_MIN_FREE and os.access(SHM_DIR, os.W_OK):
            return scratch.make("slab", SHM_DIR)
    except OSError:
        pass
    return tmp


def kill_group(proc: subprocess.Popen | ForkedChild) -> None:
    """Kill the child's whole process group (anything the candidate left running), then reap the child (a forked
    one: have its template reap it).

    The group is signalled before the leader is reaped, so its id cannot belong to an unrelated process yet.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    if isinstance(proc, ForkedChild):
        proc.release()


def status(proc: subprocess.Popen | ForkedChild) -> int | None:
    """The child's exit status in Popen's convention (-N for signal N), or None while it runs.

    It peeks without reaping, so the pid, and with it the process-group id, stays reserved until kill_group.
    """
    if proc.returncode is not None or isinstance(proc, ForkedChild):
        return proc.poll()
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


class WorkerProcess:
    """One candidate process started for `device`, waiting for its configuration.

    Attributes:
        tmp: the evaluation's private folder (mode 0700); the worker runs in tmp/candidate.
        slabs: where the tensor slabs go (shared memory when roomy, else tmp).
        service_fds: the pipe ends the evaluation service talks to the worker through (requests out, replies
            in); handed to the service, then closed here.
    """

    def __init__(self, device: str, *, cpus: set[int] | None = None, netns: bool = True, gpu: str | None = None,
                 template: Template | None = None, fresh_note: str = "fresh interpreter"):
        self.device = device
        self.gpu = gpu
        """The GPU it may see (CUDA_VISIBLE_DEVICES), as its evaluation service does; None: the caller's."""
        self.tmp = scratch.make("eval")
        self.cand_dir = self.tmp / "candidate"
        self.cand_dir.mkdir()
        self.slabs = _slab_dir(self.tmp)
        self.log = self.tmp / "worker.log"
        self.proc: subprocess.Popen | ForkedChild | None = None
        self.start_note = fresh_note
        """How it started: "forked from template PID", or a fresh interpreter (and why not forked)."""
        self.service_fds: tuple[int, int] | None = None
        self.warmed = False
        """Whether it was told to warm up (warm())."""
        self.closed = False
        try:
            if template is not None:
                self._fork(template)
            else:
                self._start(netns)
            if cpus:
                try:
                    os.sched_setaffinity(self.pid, cpus)
                except (AttributeError, OSError):
                    pass
        except BaseException:
            self.discard()
            raise

    def _pipes(self) -> tuple[int, int, int, int]:
        """(to_worker_r, to_worker_w, from_worker_r, from_worker_w), the service's ends widened."""
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        for fd in (to_worker_w, from_worker_w):
            wire.widen(fd)
        return to_worker_r, to_worker_w, from_worker_r, from_worker_w

    def _fork(self, template: Template) -> None:
        """A child of the template in place of a fresh interpreter.

        Raises:
            TemplateError: the template could not fork one (nothing is left open).
        """
        to_worker_r, to_worker_w, from_worker_r, from_worker_w = self._pipes()
        stdin_r, stdin_w = os.pipe()
        given = False
        try:
            with self.log.open("wb") as out:
                self.proc = template.fork(self.cand_dir, stdin_r, to_worker_r, from_worker_w, out.fileno(), stdin_w)
            given = True
        finally:
            for fd in (stdin_r, to_worker_r, from_worker_w):  # only the child holds these now
                os.close(fd)
            if not given:
                for fd in (stdin_w, to_worker_w, from_worker_r):
                    os.close(fd)
        self.start_note = f"forked from template {template.pid}"
        self.service_fds = (to_worker_w, from_worker_r)

    def _start(self, netns: bool) -> None:
        to_worker_r, to_worker_w, from_worker_r, from_worker_w = self._pipes()
        try:
            argv = tether.python_argv("workbench.evaluator.worker", self.device, str(to_worker_r), str(from_worker_w))
            if netns:
                argv.append("--netns")
            with self.log.open("wb") as out:
                self.proc = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                    pass_fds=(to_worker_r, from_worker_w), cwd=self.cand_dir,
                    env=isolation.candidate_env(self.device, gpu=self.gpu),
                    start_new_session=True,  # its own process group, so a timeout kills everything it started
                )
        except BaseException:
            for fd in (to_worker_r, to_worker_w, from_worker_r, from_worker_w):
                os.close(fd)
            raise
        finally:
            if self.proc is not None:
                for fd in (to_worker_r, from_worker_w):  # only the worker holds these now: EOF means its death
                    os.close(fd)
        self.service_fds = (to_worker_w, from_worker_r)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return not self.closed and self.proc is not None and self.proc.poll() is None

    def warm(self) -> None:
        """Have the waiting worker create its CUDA context and launch Triton once now (it waits for this, or for
        its configuration, before touching the GPU)."""
        if self.warmed or self.proc is None or self.proc.stdin is None:
            return
        self.warmed = True
        try:
            self.proc.stdin.write(WARM_LINE + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def configure(self, cfg_json: bytes) -> None:
        """Hand the worker its configuration (it has been waiting on stdin); a worker already gone is not an error
        here: its pipe then reports the death to the service, and its log tail says why."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(cfg_json + b"\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def release_service_fds(self) -> None:
        """Close this process's copies of the service's pipe ends (once the service holds its own)."""
        if self.service_fds is not None:
            for fd in self.service_fds:
                os.close(fd)
            self.service_fds = None

    def discard(self, keep_dir: bool = False) -> None:
        """Kill the worker's process group, close our pipe ends, remove the private folders (unless keep_dir)."""
        self.closed = True
        if self.proc is not None:
            if self.proc.stdin is not None and not self.proc.stdin.closed:
                try:
                    self.proc.stdin.close()
                except OSError:
                    pass
            kill_group(self.proc)
        self.release_service_fds()
        if self.slabs != self.tmp:
            shutil.rmtree(self.slabs, ignore_errors=True)
        if not keep_dir:
            shutil.rmtree(self.tmp, ignore_errors=True)


class Prestarter:
    """Keeps one started worker for the next evaluation, forked from its template where it can; thread-safe, so
    another thread may close it.

    Create it (and so its template, started with the first worker) from a thread that lives as long as it does.
    """

    def __init__(self, device: str, *, cpus: set[int] | None = None, netns: bool = True,
                 gpu: str | None = None, template: bool = True) -> None:
        self.device = device
        self.cpus = cpus
        """CPUs a waiting worker may use: the machine's less the timing processes' (None: all)."""
        self.netns = netns
        self.gpu = gpu
        """The GPU its workers may see (None: the caller's visible GPUs)."""
        self._ready: WorkerProcess | None = None
        self._lock = threading.Lock()
        self.hits = 0
        """Evaluations that found a ready worker (one that died while waiting counts as a miss)."""
        self._template: Template | None = None
        self._template_lock = threading.Lock()
        self.template_starts = 0
        """Templates started so far (the first and its replacements)."""
        self.template_note = "on" if template and templates_wanted() else "off"
        """Why workers are fresh interpreters, once they are ("off": not wanted here; else the last failure)."""
        self._use_template = self.template_note == "on"
        self._closed = False

    def _template_for_next(self) -> Template | None:
        """The template to fork the next worker from: the running one, a new one in place of a dead one (while
        restarts last), or None (fresh interpreters)."""
        if self._template is not None and not self._template.alive():
            self._template_failed(f"template {self._template.pid} died")
        if self._template is None and self._use_template:
            if self.template_starts > TEMPLATE_RESTARTS:
                self._use_template = False
                self.template_note += f"; {TEMPLATE_RESTARTS} restarts used, fresh interpreters from now on"
                return None
            self.template_starts += 1
            try:
                self._template = Template(self.device, cpus=self.cpus, netns=self.netns, gpu=self.gpu)
            except OSError as exc:
                self.template_note = f"the template did not start ({exc})"
                return None
        return self._template

    def _template_failed(self, why: str) -> None:
        if self._template is not None:
            self._template.close()
            self._template = None
        self.template_note = why

    def _new_worker(self) -> WorkerProcess:
        """A worker forked from the template, or a fresh interpreter when there is none (or it failed)."""
        with self._template_lock:
            if self._closed:
                raise OSError("the prestarter is closed")
            template = self._template_for_next()
            if template is not None:
                try:
                    return WorkerProcess(self.device, cpus=self.cpus, netns=self.netns, gpu=self.gpu,
                                         template=template)
                except TemplateError as exc:
                    self._template_failed(str(exc))
                    if exc.refused:  # any template here would refuse: stop paying their imports
                        self._use_template = False
            fresh = "fresh interpreter" if self.template_note == "off" else \
                f"fresh interpreter (no template: {self.template_note})"
        return WorkerProcess(self.device, cpus=self.cpus, netns=self.netns, gpu=self.gpu, fresh_note=fresh)

    @property
    def template(self) -> Template | None:
        """The running template, if any."""
        return self._template

    def take(self) -> WorkerProcess:
        """A worker for the next evaluation: the waiting one if it is still alive, else a new one (cold)."""
        with self._lock:
            worker, self._ready = self._ready, None
        if worker is not None and not worker.alive():
            worker.discard()
            worker = None
        if worker is not None:
            self.hits += 1
            return worker
        return self._new_worker()

    def replenish(self) -> None:
        """Start a worker unless one is waiting. Call when nothing is being timed on this device."""
        with self._lock:
            if self._ready is not None:
                return
            self._ready = self._new_worker()

    def warm(self) -> None:
        """Let the waiting worker touch the GPU now (call once nothing is being timed)."""
        with self._lock:
            worker = self._ready
        if worker is not None:
            worker.warm()

    @property
    def waiting(self) -> WorkerProcess | None:
        """The worker waiting for the next evaluation, if any."""
        return self._ready

    def close(self) -> None:
        """Stop and remove the waiting worker and the template (not waiting for a fork in progress: closing the
        template ends it)."""
        self._closed = True
        with self._lock:
            worker, self._ready = self._ready, None
        if worker is not None:
            worker.discard()
        template = self._template
        if template is not None:
            template.close()
