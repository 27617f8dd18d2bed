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
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

from workbench.evaluator import isolation, tether, wire

WARM_LINE = b"warm"
"""What the owner writes on a waiting worker's stdin to have it touch the GPU now (context, Triton's first launch)."""
SHM_DIR = "/dev/shm"
SHM_MIN_FREE = 4 << 30
"""The tensor slabs go to shared memory when it has this much room (a container's default /dev/shm is 64 MB);
otherwise they live in the evaluation's private folder, which the page cache serves nearly as fast."""


def _slab_dir(tmp: Path) -> Path:
    try:
        st = os.statvfs(SHM_DIR)
        if st.f_bavail * st.f_frsize >= SHM_MIN_FREE and os.access(SHM_DIR, os.W_OK):
            return Path(tempfile.mkdtemp(prefix="workbench-slab-", dir=SHM_DIR))
    except OSError:
        pass
    return tmp


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the child's whole process group (anything the candidate left running), then reap the child.

    The group is signalled before the leader is reaped, so its id cannot belong to an unrelated process yet.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def status(proc: subprocess.Popen) -> int | None:
    """The child's exit status in Popen's convention (-N for signal N), or None while it runs.

    It peeks without reaping, so the pid, and with it the process-group id, stays reserved until kill_group.
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


class WorkerProcess:
    """One candidate process started for `device`, waiting for its configuration.

    Attributes:
        tmp: the evaluation's private folder (mode 0700); the worker runs in tmp/candidate.
        slabs: where the tensor slabs go (shared memory when roomy, else tmp).
        service_fds: the pipe ends the evaluation service talks to the worker through (requests out, replies
            in); handed to the service, then closed here.
    """

    def __init__(self, device: str, *, cpus: set[int] | None = None, netns: bool = True, gpu: str | None = None):
        self.device = device
        self.gpu = gpu
        """The GPU it may see (CUDA_VISIBLE_DEVICES), as its evaluation service does; None: the caller's."""
        self.tmp = Path(tempfile.mkdtemp(prefix="workbench-eval-"))
        self.cand_dir = self.tmp / "candidate"
        self.cand_dir.mkdir()
        self.slabs = _slab_dir(self.tmp)
        self.log = self.tmp / "worker.log"
        self.proc: subprocess.Popen | None = None
        self.service_fds: tuple[int, int] | None = None
        self.warmed = False
        """Whether it was told to warm up (warm())."""
        self.closed = False
        try:
            self._start(cpus, netns)
        except BaseException:
            self.discard()
            raise

    def _start(self, cpus: set[int] | None, netns: bool) -> None:
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        try:
            for fd in (to_worker_w, from_worker_w):
                wire.widen(fd)
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
        if cpus:
            try:
                os.sched_setaffinity(self.proc.pid, cpus)
            except (AttributeError, OSError):
                pass

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
    """Keeps one started worker for the next evaluation; thread-safe, so another thread may close it."""

    def __init__(self, device: str, *, cpus: set[int] | None = None, netns: bool = True,
                 gpu: str | None = None) -> None:
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
        return WorkerProcess(self.device, cpus=self.cpus, netns=self.netns, gpu=self.gpu)

    def replenish(self) -> None:
        """Start a worker unless one is waiting. Call when nothing is being timed on this device."""
        with self._lock:
            if self._ready is not None:
                return
            self._ready = WorkerProcess(self.device, cpus=self.cpus, netns=self.netns, gpu=self.gpu)

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
        """Stop and remove the waiting worker."""
        with self._lock:
            worker, self._ready = self._ready, None
        if worker is not None:
            worker.discard()
