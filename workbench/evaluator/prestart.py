"""Evaluator process pairs started ahead of need, so an evaluation does not wait for two torch imports.

An evaluation runs in a trusted harness and a candidate worker, each a fresh process. Most of their start-up
(interpreter, torch, triton, the CUDA context, Triton's first launch, the environment report) depends only on the
device, so a pair can be started before anyone knows which candidate it will run: each process imports and warms
up, then blocks reading its configuration on stdin. An evaluation takes a ready pair, writes the two
configurations, and the pair is used exactly once, as a cold pair would be. Nothing of one candidate can reach the
next, since no process outlives its evaluation.

A `Prestarter` keeps one such pair per device. It starts the next pair only when asked (`replenish`, after an
evaluation ends), never while one is timing kernels, so the imports of a starting pair cannot disturb a
measurement. A pair left unused exits when its stdin closes (the owner closes it, or dies).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from workbench.evaluator import wire

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


def child_env(device: str) -> dict[str, str]:
    """The children's environment: this checkout first on the path, faulthandler on, the interpreter for CPU."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU evaluation must not quietly use a GPU
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def _spawn(module: str, device: str, fds: tuple[int, ...], log: Path, cwd: Path,
           env: dict[str, str]) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, device],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=fds,
            cwd=cwd,
            env=env,
            start_new_session=True,  # its own process group, so a timeout kills everything it started
        )


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the child's whole process group (anything the candidate left running), then reap the child.

    The group is signalled before the leader is reaped, so its id cannot belong to an unrelated process yet.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


class Pair:
    """One harness and one worker, started for `device`, waiting for their configurations.

    Attributes:
        tmp: the evaluation's private folder (mode 0700); the worker runs in tmp/candidate.
        slabs: where the tensor slabs go (shared memory when roomy, else tmp).
        parent_in: the one pipe end this process keeps: the harness's messages (EOF when it dies).
    """

    def __init__(self, device: str):
        self.device = device
        self.tmp = Path(tempfile.mkdtemp(prefix="workbench-eval-"))
        self.cand_dir = self.tmp / "candidate"
        self.cand_dir.mkdir()
        self.slabs = _slab_dir(self.tmp)
        self.procs: list[subprocess.Popen] = []
        self.parent_in: int | None = None
        self.closed = False
        try:
            self._start()
        except BaseException:
            self.discard()
            raise

    def _start(self) -> None:
        h2w_r, h2w_w = os.pipe()
        w2h_r, w2h_w = os.pipe()
        h2p_r, h2p_w = os.pipe()
        self.parent_in = h2p_r
        children_ends = (h2w_r, h2w_w, w2h_r, w2h_w, h2p_w)
        try:
            for fd in (h2w_w, w2h_w):
                wire.widen(fd)
            env = child_env(self.device)
            self.worker_log = self.tmp / "worker.log"
            self.harness_log = self.tmp / "harness.log"
            self.worker = _spawn("workbench.evaluator.worker", self.device, (h2w_r, w2h_w), self.worker_log,
                                 self.cand_dir, env)
            self.procs.append(self.worker)
            self.harness = _spawn("workbench.evaluator.harness", self.device, (h2w_w, w2h_r, h2p_w),
                                  self.harness_log, self.tmp, env)
            self.procs.append(self.harness)
        finally:
            for fd in children_ends:  # only the children hold these now: EOF means death
                os.close(fd)
        self.worker_fds = (h2w_r, w2h_w)
        """The worker's (requests in, replies out) descriptor numbers, as inherited."""
        self.harness_fds = (h2w_w, w2h_r, h2p_w)
        """The harness's (to worker, from worker, to parent) descriptor numbers, as inherited."""

    def alive(self) -> bool:
        return not self.closed and all(p.poll() is None for p in self.procs)

    def send(self, worker_cfg: dict[str, Any], harness_cfg: dict[str, Any]) -> None:
        """Hand each child its configuration (it has been waiting on stdin); a child already gone is not an
        error here: the harness's pipe then reports the death, with the log tail, like any other."""
        for proc, cfg in ((self.worker, worker_cfg), (self.harness, harness_cfg)):
            try:
                proc.stdin.write(json.dumps(cfg).encode())  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]
            except (BrokenPipeError, OSError):
                pass

    def discard(self, keep_dir: bool = False) -> None:
        """Kill both process groups, close our pipe ends, remove the private folders (unless keep_dir)."""
        self.closed = True
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.closed:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
            kill_group(proc)
        if self.parent_in is not None:
            os.close(self.parent_in)
            self.parent_in = None
        if self.slabs != self.tmp:
            shutil.rmtree(self.slabs, ignore_errors=True)
        if not keep_dir:
            shutil.rmtree(self.tmp, ignore_errors=True)


class Prestarter:
    """Keeps one started pair per device for the next evaluation; thread-safe, so a UI thread may close it."""

    def __init__(self) -> None:
        self._ready: dict[str, Pair] = {}
        self._lock = threading.Lock()
        self.hits = 0
        """Evaluations that found a ready pair (a pair that died while waiting counts as a miss)."""

    def take(self, device: str) -> Pair | None:
        """The ready pair for device, if it is still alive; the caller owns it from here."""
        with self._lock:
            pair = self._ready.pop(device, None)
        if pair is not None and not pair.alive():
            pair.discard()
            pair = None
        if pair is not None:
            self.hits += 1
        return pair

    def replenish(self, device: str) -> None:
        """Start a pair for device unless one is ready. Call when no evaluation is timing on this device."""
        with self._lock:
            if device in self._ready:
                return
            self._ready[device] = Pair(device)

    def close(self) -> None:
        """Stop and remove every waiting pair."""
        with self._lock:
            pairs, self._ready = list(self._ready.values()), {}
        for pair in pairs:
            pair.discard()

    def __enter__(self) -> "Prestarter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
