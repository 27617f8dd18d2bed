"""Signals that stop a run (SIGTERM, SIGHUP, SIGINT): a stop request naming the signal, never a sudden death.

A Python signal handler runs in the main thread between any two bytecodes, even while that thread holds a lock the
stop request needs (the runtime's, an Event's), so the handler only writes the signal's number to a pipe; a watcher
thread reads it and calls `on_signal(signum)`, which may lock, journal and kill an evaluation's processes. A SIGHUP
also means the terminal is gone and its descriptors now fail (EIO): the handler points them at /dev/null first, so
printing (and a TUI's writer and reader threads) keep working until the run has journaled its stop.
"""

from __future__ import annotations

import os
import signal
import stat
import threading
from typing import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""The signals that stop a run cleanly (SIGKILL cannot be caught: resume repairs what it leaves)."""


def stop_reason(signum: int) -> str:
    """What run.stopped journals for a signal: 'stopped by signal SIGTERM'."""
    name = signal.Signals(signum).name
    detail = {signal.SIGHUP: " (the terminal hung up)", signal.SIGINT: " (Ctrl-C)"}.get(signal.Signals(signum), "")
    return f"stopped by signal {name}{detail}"


def _is_terminal(fd: int) -> bool:
    """Whether fd is a terminal, judged from fstat: isatty() asks the terminal itself, which a hangup disables."""
    try:
        found, null = os.fstat(fd), os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(found.st_mode) and found.st_rdev != null.st_rdev


class StopSignals:
    """While installed, STOP_SIGNALS call `on_signal(signum)` from a watcher thread (see stop_reason).

    Install and restore from the main thread (Python's rule for signal handlers).
    """

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self.on_signal = on_signal
        """Called with the signal's number, once per signal received, from the watcher thread."""
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous: dict[int, object] = {}
        self._thread = threading.Thread(target=self._watch, name="stop signals", daemon=True)

    def install(self) -> "StopSignals":
        """Put the handlers in place and start the watcher; returns self.

        A signal this process was started ignoring stays ignored: `nohup` ignores SIGHUP so that a run outlives its
        terminal, and a shell's background job ignores SIGINT.
        """
        self._thread.start()
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        """Put back the handlers found at install() and end the watcher."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()
        os.close(self._write)
        self._thread.join(5)
        os.close(self._read)

    def _handle(self, signum: int, frame: object) -> None:
        if signum == signal.SIGHUP:
            self._detach_terminal()
        try:
            os.write(self._write, bytes([signum]))
        except OSError:
            pass  # the pipe is full of earlier signals: the stop is requested already

    @staticmethod
    def _detach_terminal() -> None:
        """Point the hung-up terminal's descriptors at /dev/null (plain system calls: safe in a handler).

        Reading it gives EOF at once, as the hung-up terminal would, rather than EIO or a read that blocks forever.
        """
        for fd, flags in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
            if _is_terminal(fd):
                null = os.open(os.devnull, flags)
                os.dup2(null, fd)
                os.close(null)

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                self.on_signal(signum)
