"""The template: a process that imports what a candidate process needs once, then forks one child per candidate.

Run as ``python -m workbench.evaluator.template DEVICE CONTROL_FD [--netns]`` by its owner
(workbench.evaluator.forked.Template), through tether.python_argv, so it dies with its owner, and with the
candidate environment (the allowlist: it holds no secret a child could read). It isolates itself as a fresh
candidate process does (network namespace where asked and allowed, the CPU mask its owner set), imports numpy,
torch, triton and the worker's modules (worker.isolate_and_import), touches no GPU and runs no torch op, then
serves fork requests on CONTROL_FD. It never imports a candidate: a child starts from this state, never from
another candidate's.

Each child, right after the fork: its own session (so its owner can kill its whole process group), the pipe ends
and log it was sent as stdin, stdout and stderr, the death signal tied to the template (which is tied to the
owner), a network namespace of its own (under the template's user namespace), fresh random seeds; then exactly
what a fresh candidate process does once imported (worker.serve_when_told): wait for "warm" or its config, the
CUDA context and Triton's first launch, ready, one evaluation, exit.

The child is the template's, not the owner's, so the template relays its exit status (Popen's convention) on a
status socket the owner sent with the request, and keeps the exited child unreaped (its pid, and with it its
process-group id, reserved) until the owner closes that socket.

Protocol on CONTROL_FD (AF_UNIX SOCK_SEQPACKET, JSON): the template says {"ready": true, "pid", "threads" (native
ones included: numpy's BLAS pool, which its fork handler takes down), "netns", "netns_note", "import_s"} once; the
owner sends {"op": "fork", "cwd"} with five fds (stdin, request pipe, reply pipe, log, status socket); the template
answers {"pid"} or {"error"}. The end of the socket ends the template.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import socket
import sys
import threading
from typing import Any

from workbench.evaluator import wire

FORK_FDS = 5
"""Descriptors a fork request carries: the child's stdin, its request and reply pipe ends, its log, the status
socket."""
_CLONE_NEWNET = 0x40000000


class _Server:
    """Forks children on request and relays their exit statuses; one request at a time, in one thread."""

    def __init__(self, device: str, sock: socket.socket, report: dict[str, Any]) -> None:
        self.device = device
        self.sock = sock
        self.report = report
        """The template's isolation and import report; each child's ready report starts from it."""
        self.children: dict[int, socket.socket] = {}
        """Each child not yet reaped, with its status socket."""
        self.reported: set[int] = set()
        """Children whose exit status was sent."""
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wake-up fd hears of each exit
        signal.set_wakeup_fd(self.wake_w)

    def serve(self) -> int:
        """Serve until the owner closes the control socket; then the children go too (the death signal)."""
        while True:
            watched = [self.sock, self.wake_r, *self.children.values()]
            ready, _, _ = select.select(watched, [], [], 1.0)
            if self.wake_r in ready:
                try:
                    while os.read(self.wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            self._relay_exits()
            for pid, status_sock in list(self.children.items()):
                if status_sock in ready:
                    self._maybe_release(pid, status_sock)
            if self.sock in ready:
                try:
                    data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, FORK_FDS)
                except OSError:
                    return 0
                if not data:
                    return 0
                self._request(json.loads(data), fds)

    def _relay_exits(self) -> None:
        """Send each newly exited child's status; it stays a zombie until its owner lets go."""
        for pid, status_sock in self.children.items():
            if pid in self.reported:
                continue
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
            if info is None:
                continue
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            self.reported.add(pid)
            try:
                status_sock.send(wire.encode_status(code))
            except OSError:
                pass

    def _maybe_release(self, pid: int, status_sock: socket.socket) -> None:
        """The owner closed its end of a status socket: kill what is left of the child's group, reap it."""
        try:
            if status_sock.recv(64):
                return  # the owner sends nothing: ignore
        except BlockingIOError:
            return
        except OSError:
            pass
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        status_sock.close()
        del self.children[pid]
        self.reported.discard(pid)

    def _request(self, msg: dict[str, Any], fds: list[int]) -> None:
        if msg.get("op") != "fork" or len(fds) != FORK_FDS:
            for fd in fds:
                os.close(fd)
            self._reply({"error": f"unknown request {msg.get('op')!r} with {len(fds)} fds"})
            return
        refusal = self._unsafe()
        if refusal:
            for fd in fds:
                os.close(fd)
            self._reply({"error": refusal})
            return
        stdin_r, to_worker_r, from_worker_w, log_fd, status_fd = fds
        sync_r, sync_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into this loop
            code = 1
            try:
                os.close(sync_r)
                os.setsid()  # its own session and process group, before the owner hears its pid
                os.close(sync_w)
                code = self._child(str(msg["cwd"]), stdin_r, to_worker_r, from_worker_w, log_fd, status_fd)
            except BaseException:  # noqa: BLE001 - whatever happens, the child must not return into the server
                import traceback

                traceback.print_exc()
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        os.close(sync_w)
        for fd in (stdin_r, to_worker_r, from_worker_w, log_fd):
            os.close(fd)
        select.select([sync_r], [], [], 10.0)  # the end of the pipe: the child has its session (or died)
        os.close(sync_r)
        self.children[pid] = socket.socket(fileno=status_fd)
        self.children[pid].setblocking(False)
        self._reply({"pid": pid})

    def _unsafe(self) -> str | None:
        """Why forking now would be unsafe (a thread of ours, a CUDA context), else None."""
        import torch

        if threading.active_count() > 1:
            return f"the template runs {threading.active_count()} Python threads"
        if torch.cuda.is_initialized():
            return "the template has initialised CUDA (forking after it is unsafe)"
        driver = _cuda_threads()
        if driver:
            return f"the CUDA driver runs {driver} threads in the template (forking after its start is unsafe)"
        return None

    def _reply(self, msg: dict[str, Any]) -> None:
        try:
            self.sock.send(json.dumps(msg).encode())
        except OSError:
            pass  # the owner is gone: the next receive ends the loop

    def _child(self, cwd: str, stdin_r: int, to_worker_r: int, from_worker_w: int, log_fd: int,
               status_fd: int) -> int:
        """Become a candidate process that has just imported, then run as one."""
        from workbench.evaluator import tether, worker

        template = os.getppid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # Nothing of the template's (its control socket, other children's status sockets) stays reachable.
        self.sock.close()
        for status_sock in self.children.values():
            status_sock.close()
        for fd in (self.wake_r, self.wake_w, status_fd):
            os.close(fd)
        os.dup2(stdin_r, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(stdin_r)
        os.close(log_fd)
        faulthandler.enable()
        os.chdir(cwd)
        if not tether.die_with_parent(template):
            return 0  # the template died before the request: nobody will talk to this process
        report = {**self.report, "import_s": 0.0, "start": "forked", "template": template}
        if self.report.get("netns"):
            report["netns_note"] = f"{self.report['netns_note']}, {_own_network_namespace()}"
        _reseed()
        return worker.serve_when_told(self.device, to_worker_r, from_worker_w, report)


def _native_threads() -> int:
    """Threads of this process, the native ones included (numpy's BLAS pool among them: it re-forms in a child
    through its fork handlers)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _cuda_threads() -> int:
    """Threads the CUDA driver started here ("cuda-EvtHandlr", "cuda0000..."): cuInit starts them, so none, with
    torch.cuda.is_initialized() False, means no CUDA state a child could inherit. libcuda may already be mapped (the
    imports map it on the H200 image, 2026-12-01): a driver loaded but never initialised is safe to fork, as
    PyTorch's own forked data-loader workers rely on."""
    count = 0
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/comm") as comm:
                count += comm.read().startswith("cuda")
    except OSError:
        pass
    return count


def _own_network_namespace() -> str:
    """Give this child a network namespace of its own (no child shares the template's with another)."""
    from workbench.evaluator import isolation

    try:
        isolation.unshare(_CLONE_NEWNET)
    except OSError as exc:
        return f"shares the template's namespace ({os.strerror(exc.errno) if exc.errno else exc})"
    return "its own under the template's"


def _reseed() -> None:
    """Fresh random state, as a fresh interpreter would have (fork reseeds Python's `random` itself)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def main() -> int:
    """Entry point: isolate, import, say ready, serve fork requests."""
    faulthandler.enable()
    args = [a for a in sys.argv[1:] if a != "--netns"]
    if len(args) != 2:
        print("usage: python -m workbench.evaluator.template DEVICE CONTROL_FD [--netns]", file=sys.stderr)
        return 2
    device, control_fd = args[0], int(args[1])
    from workbench.evaluator import worker

    report = worker.isolate_and_import("--netns" in sys.argv[1:])
    sock = socket.socket(fileno=control_fd)
    server = _Server(device, sock, report)
    refusal = server._unsafe()
    try:
        ready = {"ready": True, "pid": os.getpid(), "threads": _native_threads(), **report}
        sock.send(json.dumps({"error": refusal} if refusal else ready).encode())
    except OSError:
        return 0
    return 1 if refusal else server.serve()


if __name__ == "__main__":
    sys.exit(main())
