"""The owner's side of the template (workbench.evaluator.template): start it, ask it for children, watch them.

A fresh candidate process spends most of its start-up (about 1.3 CPU-seconds on the CPU box) importing numpy, torch,
Triton and our modules, the same for every candidate. A template pays that once per evaluation service and forks a
child per candidate, which is then what a fresh process is once imported. The owner treats a child as it treats a
fresh one: its stdin, its pipe ends, its log, its process group, its exit status (relayed by the template).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from workbench.evaluator import crashes, isolation, limits, scratch, tether, wire

NO_TEMPLATE_ENV = "WORKBENCH_NO_TEMPLATE"
"""Set (to anything) to start every candidate process as a fresh interpreter."""
TEMPLATE_MODULE = "workbench.evaluator.template"
"""The module the template process runs."""
FORK_REPLY_S = 30.0
"""How long a ready template gets to answer a fork request (it forks at once; a busy machine is slow)."""


class TemplateError(Exception):
    """The template did not start, died, or did not answer: the caller starts a fresh interpreter instead.

    Attributes:
        refused: the template refused to fork (it found itself unsafe to fork: a thread, the CUDA driver), which
            another template on this machine would do too.
    """

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


def templates_wanted() -> bool:
    """Whether candidate processes should be forked from a template here (POSIX, not switched off)."""
    return hasattr(os, "fork") and hasattr(socket, "send_fds") and not os.environ.get(NO_TEMPLATE_ENV)


class ForkedChild:
    """A candidate process forked by a template: the part of a Popen its owner uses (pid, stdin, poll, wait, kill).

    Its exit status comes from the template, which keeps the exited child unreaped until release(), so the pid and
    the process-group id stay reserved as with a Popen child that is peeked at, not reaped. A template that dies
    takes its children with it (their death signal): the status is then SIGKILL's, and template_lost says why.
    """

    def __init__(self, pid: int, status_sock: socket.socket, stdin: Any) -> None:
        self.pid = pid
        self.stdin = stdin
        """The write end of the child's stdin (binary, buffered, as Popen's)."""
        self.returncode: int | None = None
        self.template_lost = False
        """The template died before it reported this child's exit."""
        self._sock: socket.socket | None = status_sock
        self._lock = threading.Lock()

    def _read(self, timeout: float) -> None:
        with self._lock:
            if self.returncode is not None or self._sock is None:
                return
            ready, _, _ = select.select([self._sock], [], [], timeout)
            if not ready:
                return
            try:
                data = self._sock.recv(256)
            except OSError:
                data = b""
            if data:
                self.returncode = wire.decode_status(data)
            else:
                self.returncode, self.template_lost = -signal.SIGKILL, True

    def poll(self) -> int | None:
        """The exit status (Popen's convention), or None while it runs; the child stays unreaped."""
        self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status.

        Raises:
            subprocess.TimeoutExpired: it still runs after `timeout` seconds.
        """
        end = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 1.0 if end is None else end - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0.0)
            self._read(min(left, 1.0))
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def release(self) -> None:
        """Let the template reap the child (and kill what is left of its group): its pid may be reused after."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


class Template:
    """One template process for `device`, started with the candidate environment and `cpus` as its CPU mask.

    Start it from a thread that lives as long as it should (tether). Thread-safe: one fork request at a time.
    """

    def __init__(self, device: str, *, cpus: set[int] | None = None, netns: bool = True, gpu: str | None = None):
        self.device = device
        self.tmp = scratch.make("template")
        self.log = self.tmp / "template.log"
        self.info: dict[str, Any] | None = None
        """Its ready report ({"pid", "netns", "netns_note", "import_s", "threads"}) once it said ready."""
        self.dead = False
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = tether.python_argv(TEMPLATE_MODULE, device, str(theirs.fileno()))
        if netns:
            argv.append("--netns")
        try:
            with self.log.open("wb") as out:
                self.proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),), cwd=self.tmp, env=isolation.candidate_env(device, gpu=gpu),
                    start_new_session=True)
        except BaseException:
            ours.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        finally:
            theirs.close()
        self.sock = ours
        if cpus:
            try:  # before it imports: its children inherit the mask
                os.sched_setaffinity(self.proc.pid, cpus)
            except (AttributeError, OSError):
                pass

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def _recv(self, timeout: float, what: str) -> dict[str, Any]:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 16)
        except socket.timeout:
            raise self._broken(f"no answer {what} within {timeout:g} s") from None
        except OSError as exc:
            raise self._broken(f"its socket failed {what} ({exc})") from None
        if not data:
            raise self._broken(f"it exited {what}")
        msg = json.loads(data)
        if "error" in msg:
            raise self._broken(f"it refused {what}: {msg['error']}", refused=True)
        return msg

    def _broken(self, why: str, refused: bool = False) -> TemplateError:
        self.dead = True
        tail, _ = crashes.log_tail(self.log, "", "")
        return TemplateError(f"template {self.proc.pid}: {why}" + (f"; last output: {tail}" if tail else ""), refused)

    def fork(self, cwd: Path, stdin_r: int, to_worker_r: int, from_worker_w: int, log_fd: int,
             stdin_w: int) -> ForkedChild:
        """A child in `cwd` with these fds as its stdin, request and reply pipe ends and log; the caller keeps
        (and closes) its own copies, and hands over stdin_w, the write end of the child's stdin.

        Raises:
            TemplateError: the template is dead, did not get ready in time, or did not answer.
        """
        with self._lock:
            if self.dead:
                raise TemplateError(f"template {self.proc.pid} is gone")
            if self.info is None:
                self.info = self._recv(limits.STARTUP_S, "while starting")
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                try:
                    socket.send_fds(self.sock, [json.dumps({"op": "fork", "cwd": str(cwd)}).encode()],
                                    [stdin_r, to_worker_r, from_worker_w, log_fd, theirs.fileno()])
                except OSError as exc:
                    raise self._broken(f"its socket failed while asked to fork ({exc})") from None
                finally:
                    theirs.close()
                reply = self._recv(FORK_REPLY_S, "while asked to fork")
            except BaseException:
                ours.close()
                raise
        return ForkedChild(int(reply["pid"]), ours, os.fdopen(stdin_w, "wb"))

    def close(self) -> None:
        """Stop the template (its waiting children die with it) and remove its folder."""
        self.dead = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.sock.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def probe(device: str = "cpu") -> tuple[bool, str]:
    """Start a template and fork one child as an evaluation service would: (forked, detail)."""
    if not templates_wanted():
        return False, "switched off" if os.environ.get(NO_TEMPLATE_ENV) else "no fork here"
    started = time.monotonic()
    try:
        template = Template(device, netns=isolation.netns_wanted())
    except OSError as exc:
        return False, f"the template did not start ({exc})"
    try:
        stdin_r, stdin_w = os.pipe()
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        log_r, log_w = os.pipe()
        child = None
        try:
            child = template.fork(template.tmp, stdin_r, req_r, rep_w, log_w, stdin_w)
            child.stdin.close()  # an unused candidate process: it exits 0 at once
            code = child.wait(FORK_REPLY_S)
            child.release()
        except (TemplateError, subprocess.TimeoutExpired) as exc:
            return False, str(exc)
        finally:
            for fd in (stdin_r, req_r, req_w, rep_r, rep_w, log_r, log_w, *([] if child else [stdin_w])):
                os.close(fd)
        if code != 0:
            return False, f"a forked child exited with status {code}"
        ready = time.monotonic() - started
        info = template.info or {}
        return True, (f"template {template.pid} ready and forking in {ready:.1f} s; import {info.get('import_s')} s, "
                      f"{info.get('threads')} threads at the fork")
    finally:
        template.close()


def report_line(device: str = "cpu") -> str:
    """`workbench doctor`'s line on how candidate processes for `device` start here."""
    on, detail = probe(device)
    how = "forked from a pre-imported template" if on else "fresh interpreters"
    return f"candidates  {how} ({detail})"
