"""Child processes that die with their parent however it dies: SIGKILL, an OOM kill, a crash (Linux PR_SET_PDEATHSIG).

Every evaluator process (the trusted service, candidate workers, pre-started ones, the service's precompile
processes, ncu and compute-sanitizer) starts through `python_argv` or `command_argv`: a few lines of the standard
library run first in the child, before any module of ours. They ask the kernel to SIGKILL the child when its parent
dies, then check that the parent is still the process that started it (it may have died before the request was
made: the child then exits at once), and only then run the module as `python -m` would (or exec the command, which
keeps the request). A clean exit of the owner also kills each child's process group (prestart.kill_group), which
reaches what a child started in its group; the death signal covers the exits where no code of the owner runs.

The kernel sends the signal when the *thread* that started the child ends, not only the process: start a long-lived
child from a thread that outlives it (the runtime's thread, a pool's slot thread, the main thread).
"""

from __future__ import annotations

import errno
import os
import shutil
import sys

_PRELUDE = """\
import os, sys
parent, target = int(sys.argv[1]), sys.argv[2]
del sys.argv[1:3]
if sys.platform.startswith("linux"):
    import ctypes
    ctypes.CDLL(None).prctl(1, ctypes.c_ulong(9), 0, 0, 0)  # PR_SET_PDEATHSIG = 1, SIGKILL = 9
if os.getppid() != parent:
    os._exit(0)  # the parent died before the request: nobody will ever talk to this process
"""
"""Arm the death signal and check the parent; argv is then [-c, ARGS...] and `target` names what to run."""
_RUN_MODULE = _PRELUDE + "import runpy\nrunpy.run_module(target, run_name='__main__', alter_sys=True)\n"
_EXEC = _PRELUDE + "os.execvp(target, [target, *sys.argv[1:]])\n"


def die_with_parent(parent: int) -> bool:
    """Arm the death signal in this process now (a child forked by the template, which runs no prelude) and check
    that `parent` is still its parent: False when it died before the request (then nobody will talk to us)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, ctypes.c_ulong(9), 0, 0, 0)  # PR_SET_PDEATHSIG = 1, SIGKILL = 9
    return os.getppid() == parent


def python_argv(module: str, *args: str) -> list[str]:
    """The argv that runs `python -m module args...` in a child tied to this process (see the module docstring)."""
    return [sys.executable, "-c", _RUN_MODULE, str(os.getpid()), module, *args]


def command_argv(argv: list[str]) -> list[str]:
    """The argv that runs a command (ncu, compute-sanitizer) tied to this process: the death signal survives exec.

    Raises:
        FileNotFoundError: the command is not an executable file (found here, as Popen would: the prelude's exec
            would only fail in the child).
    """
    found = shutil.which(argv[0])
    if found is None:
        raise FileNotFoundError(errno.ENOENT, "no such executable", argv[0])
    return [sys.executable, "-c", _EXEC, str(os.getpid()), found, *argv[1:]]
