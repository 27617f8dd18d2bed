"""What candidate processes may see of the machine: an allowlisted environment, no network, their own Triton cache.

Layers, outermost first (`workbench doctor` prints which are on here):
1. environment allowlist: a candidate process gets the variables it needs to run torch and Triton (paths, locale,
   CUDA, Triton, threading knobs) and nothing that looks like a credential, whatever the parent holds;
2. network namespace (Linux, where unprivileged user namespaces or root allow it): the candidate process moves
   into a namespace of its own before it imports anything, with no interface but a loopback that is down;
3. its own Triton cache directory, apart from the trusted process's, so nothing a candidate process writes there
   can touch the baseline's compiled kernels or autotuning choices;
4. the Python-level guards (static checks, audit hook, dispatch recorder, thread and timer checks), unchanged.
Processes that run trusted code only (the evaluation service) keep the parent's environment less credentials.

This module imports nothing heavy: the worker calls enter_network_namespace() before it imports torch, because
unshare(CLONE_NEWUSER) refuses a process that already runs threads.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from pathlib import Path

ALLOWED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "TEMP", "TMP",
    "PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV", "CONDA_PREFIX",
    "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH", "CC", "CXX", "XDG_CACHE_HOME", "CUDA_HOME", "CUDA_PATH",
})
"""Variables a candidate process keeps by name ..."""
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TRITON_", "TORCH_", "PYTORCH_", "OMP_", "MKL_", "OPENBLAS_",
                    "NCCL_", "NVSHMEM_", "KMP_", "GOMP_")
"""... or by prefix (NCCL_ and NVSHMEM_ carry the box's multicast-off settings, which must reach every process)."""
DENIED = ("*_KEY", "*_KEYS", "*TOKEN*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "*CREDENTIAL*", "*_AUTH*",
          "ANTHROPIC_*", "OPENAI_*", "AWS_*", "HF_*", "HUGGING_FACE_*", "HUGGINGFACE_*", "GITHUB_*", "GH_*",
          "GOOGLE_*", "GCP_*", "AZURE_*", "WANDB_*", "*_API_*", "SSH_*", "GPG_*", "RAY_*")
"""Names no evaluator process gets, even where the allowlist would let them through (TORCH_HUB_TOKEN, say)."""
NO_NETNS_ENV = "WORKBENCH_NO_NETNS"
"""Set (to anything) to keep candidate processes in the machine's network namespace."""
CANDIDATE_CACHE = "triton-candidates"
"""Subfolder of the workbench cache that candidate processes use as their Triton cache."""

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000


def denied(name: str) -> bool:
    """True for a variable that looks like a credential (or belongs to a service a kernel has no business with)."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in DENIED)


def allowed(name: str) -> bool:
    """True for a variable a candidate process keeps."""
    return not denied(name) and (name in ALLOWED or name.startswith(ALLOWED_PREFIXES))


def checkout_root() -> str:
    """This checkout's root, which child processes import workbench from (so they run this tree's code)."""
    return str(Path(__file__).resolve().parents[2])


def _with_checkout(env: dict[str, str]) -> dict[str, str]:
    root = checkout_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def trusted_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a trusted child (the evaluation service, ncu's driver, compute-sanitizer): the parent's
    less credentials, with this checkout first on the path."""
    source = os.environ if base is None else base
    return _with_checkout({k: v for k, v in source.items() if not denied(k)})


def cache_dir() -> Path:
    """The workbench's per-machine cache folder ($XDG_CACHE_HOME/workbench, else ~/.cache/workbench)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "workbench"


def candidate_env(device: str, base: dict[str, str] | None = None, gpu: str | None = None) -> dict[str, str]:
    """The environment of a candidate process: the allowlist, this checkout on the path, its own Triton cache,
    faulthandler on, and for the CPU the Triton interpreter with every GPU hidden; on CUDA with `gpu`, that GPU
    alone (what its evaluation service sees)."""
    source = os.environ if base is None else base
    env = _with_checkout({k: v for k, v in source.items() if allowed(k)})
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    env["TRITON_CACHE_DIR"] = str(cache_dir() / CANDIDATE_CACHE)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU evaluation must not quietly use a GPU
    else:
        env.pop("TRITON_INTERPRET", None)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def netns_wanted() -> bool:
    """Whether candidate processes should try a network namespace of their own (Linux, not switched off)."""
    return sys.platform.startswith("linux") and not os.environ.get(NO_NETNS_ENV)


def enter_network_namespace() -> tuple[bool, str]:
    """Move this (single-threaded) process into a new network namespace: (entered, a note on how or why not).

    As root a network namespace is enough; otherwise a user namespace comes first, mapping our own uid and gid
    onto themselves so the process keeps its identity (without the map it would still reach its files, as
    "nobody").
    """
    if not sys.platform.startswith("linux"):
        return False, "not Linux"
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWNET if uid == 0 else _CLONE_NEWUSER | _CLONE_NEWNET
    try:
        unshare(flags)
    except OSError as exc:
        return False, f"unshare refused: {os.strerror(exc.errno) if exc.errno else exc}"
    if uid == 0:
        return True, "network namespace"
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    except OSError as exc:
        return True, f"user and network namespace, no id map ({exc.strerror})"
    return True, "user and network namespace"


def unshare(flags: int) -> None:
    """unshare(2) for this process (os.unshare where Python has it, else libc's).

    Raises:
        OSError: the kernel refused.
    """
    native = getattr(os, "unshare", None)  # Python 3.12+
    if native is not None:
        native(flags)
        return
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def interfaces() -> list[str]:
    """Network interfaces this process sees (only "lo" inside a fresh network namespace)."""
    import socket

    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        return []


_PROBE = ("from workbench.evaluator import isolation as i; on, note = i.enter_network_namespace(); "
          "print(('ok:' + note + ':' + ','.join(i.interfaces())) if on else note)")


def probe_network_namespace(timeout_s: float = 20.0) -> tuple[bool, str]:
    """Try the network namespace in a child process as a candidate process would: (on, detail)."""
    if not netns_wanted():
        return False, "switched off" if os.environ.get(NO_NETNS_ENV) else "not Linux"
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s,
                              env=candidate_env("cpu"))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"probe failed ({exc})"
    out = proc.stdout.strip()
    if proc.returncode == 0 and out.startswith("ok:"):
        _, how, seen = out.split(":", 2)
        return True, f"{how}; interfaces inside: {seen or 'none'}"
    return False, out or proc.stderr.strip()[-200:] or f"probe exited {proc.returncode}"


def report_lines() -> list[str]:
    """`workbench doctor`'s lines on how candidate processes are isolated here."""
    env = candidate_env("cpu")
    dropped = sorted(k for k in os.environ if k not in env)
    secrets = [k for k in dropped if denied(k)]
    on, detail = probe_network_namespace()
    return [
        f"isolation   environment allowlist on: {len(env)} variables passed, {len(dropped)} withheld "
        f"({len(secrets)} look like credentials)",
        f"isolation   network namespace {'on' if on else 'off'} ({detail})",
        f"isolation   candidate Triton cache {cache_dir() / CANDIDATE_CACHE} (apart from the trusted process's)",
        "isolation   Python guards on (static checks, audit hook, dispatch recorder, thread and timer checks)",
    ]
