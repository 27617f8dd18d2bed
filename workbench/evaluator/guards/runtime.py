"""Checks made inside the candidate process while it runs: imports, audit events, dispatched ops, threads, timers.

They back up the static checks for what a static pass cannot see: imports built from strings or done by a helper,
torch ops reached through a computed name, a thread started by a library call. Each check records a violation with
the candidate's line where one is known; the worker turns the first into a `forbidden` verdict.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType
from typing import Any, Iterable

from workbench.evaluator.guards.static import ALLOWED_IMPORTS, allowed_module

SAFE_EVENTS = frozenset({"import"})
"""Audit events candidate code may raise itself (an import is then checked against the allowlist)."""

DENIED_OWNERS = frozenset({
    "threading", "_thread", "concurrent", "multiprocessing", "subprocess", "os", "posix", "sys", "ctypes", "_ctypes",
    "gc", "inspect", "importlib", "builtins", "io", "_io", "socket", "signal", "pickle", "marshal", "mmap", "time",
    "asyncio", "shutil", "pathlib", "tempfile", "runpy", "code", "types", "weakref", "atexit", "faulthandler",
})
"""Modules whose functions or classes found in a candidate's namespace mean it reached past the allowlist."""

ALLOWED_OPS = frozenset({
    # allocation and initialisation
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill_", "zero_", "scalar_tensor", "resize_",
    # views and metadata
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "transpose", "t", "permute", "expand",
    "unsqueeze", "squeeze", "select", "slice", "narrow", "split", "split_with_sizes", "chunk", "unbind", "alias",
    "detach", "lift_fresh", "set_", "view_as_real", "view_as_complex", "unflatten", "flatten", "movedim",
    "is_same_size", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
    # copies
    "copy_", "clone", "_to_copy", "contiguous", "lift_fresh_copy", "record_stream",
})
"""aten ops (overload packet names) a candidate's forward may dispatch: allocation, views and copies. Any compute op
means the work was done by PyTorch, not by the candidate's kernels (HARNESS.md L1)."""


class AuditGuard:
    """A sys.addaudithook watcher that refuses audit events raised by the candidate's own code.

    An event is the candidate's when the innermost frame outside the import machinery belongs to the candidate file;
    events torch or triton raise on its behalf (their imports, cache files) are theirs and pass. A refused event
    raises PermissionError in the candidate and is recorded, so catching the error does not hide it.
    Audit hooks cannot be removed once added, which is the point.
    """

    _MACHINERY = ("<frozen importlib", "importlib/__init__.py", "importlib\\__init__.py")

    def __init__(self, candidate_file: str):
        self.candidate_file = candidate_file
        self.violations: list[tuple[int | None, str]] = []
        self._busy = False

    def install(self) -> None:
        """Add the hook (for the rest of the process's life)."""
        sys.addaudithook(self._hook)

    def _candidate_line(self) -> int | None:
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if name == self.candidate_file:
                return frame.f_lineno
            if not name.startswith(self._MACHINERY[0]) and not name.endswith(self._MACHINERY[1:]):
                return None
            frame = frame.f_back
        return None

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self._busy:  # sys._getframe below raises its own audit event
            return
        self._busy = True
        try:
            line = self._candidate_line()
        finally:
            self._busy = False
        if line is None:
            return
        if event == "import":
            module = str(args[0]) if args else ""
            if allowed_module(module):
                return
            message = f"imports {module!r} at run time (allowed: {', '.join(ALLOWED_IMPORTS)})"
        elif event in SAFE_EVENTS:
            return
        else:
            detail = ""
            if args and isinstance(args[0], (str, bytes)):
                detail = f" ({str(args[0])[:80]})"
            message = f"raised the audit event {event}{detail}, which candidate code may not cause"
        self.violations.append((line, message))
        raise PermissionError(f"workbench evaluator: {message}")


def namespace_violations(module: ModuleType) -> list[str]:
    """What a loaded candidate module holds that it should not: modules off the allowlist, functions from them.

    Catches imports that raise no audit event (a module already in sys.modules, such as time or threading) and
    objects smuggled in from a banned module.
    """
    # Triton's interpreter copies its own module globals (ast, inspect, textwrap...) into every kernel's module.
    interp = sys.modules.get("triton.runtime.interpreter")
    injected = vars(interp) if interp is not None else {}
    found = []
    for name, value in list(vars(module).items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        if name in injected and injected[name] is value:
            continue
        if isinstance(value, ModuleType):
            if not allowed_module(value.__name__):
                found.append(f"module {value.__name__} (as {name})")
            continue
        owner = getattr(value, "__module__", None)
        if isinstance(owner, str) and owner.split(".")[0] in DENIED_OWNERS and callable(value):
            found.append(f"{owner}.{getattr(value, '__qualname__', name)} (as {name})")
    return found


def forbidden_modules(loaded: Iterable[str], banned: Iterable[str]) -> list[str]:
    """The top-level banned packages among `loaded` module names (e.g. a `sys.modules` diff), sorted.

    Catches what static checks cannot see: imports built from strings, imports done by a helper module.
    """
    banned = list(banned)
    hits = set()
    for mod in loaded:
        for name in banned:
            if mod == name or mod.startswith(name + "."):
                hits.add(name)
    return sorted(hits)


def python_threads() -> set[int]:
    """Idents of the live Python threads (threading's view; a thread started with _thread shows once it runs)."""
    return {t.ident for t in threading.enumerate() if t.ident is not None}


def make_op_recorder() -> Any:
    """A TorchDispatchMode that counts the aten ops dispatched while it is active (imports torch)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpRecorder(TorchDispatchMode):
        """Counts every op that reaches the dispatcher inside `with recorder:`; disallowed ones are kept by name."""

        def __init__(self) -> None:
            super().__init__()
            self.disallowed: dict[str, int] = {}

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # Otherwise torch wraps __torch_dispatch__ in a dynamo guard whose first use imports torch._dynamo:
            # 2.5 s of a candidate's first call, for a mode that never meets torch.compile.
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
            packet = func.overloadpacket
            name = getattr(packet, "__name__", str(func))
            namespace = getattr(func, "namespace", "aten")
            if namespace != "aten" or name not in ALLOWED_OPS:
                key = f"{namespace}.{name}"
                self.disallowed[key] = self.disallowed.get(key, 0) + 1
            return func(*args, **(kwargs or {}))

    return OpRecorder()


def _timer_slots() -> dict[str, tuple[object, str]]:
    import statistics
    import time

    import torch

    slots: dict[str, tuple[object, str]] = {
        "time.perf_counter": (time, "perf_counter"),
        "time.perf_counter_ns": (time, "perf_counter_ns"),
        "time.monotonic": (time, "monotonic"),
        "statistics.median": (statistics, "median"),
        "statistics.quantiles": (statistics, "quantiles"),
        "torch.cuda.synchronize": (torch.cuda, "synchronize"),
        "torch.cuda.Event": (torch.cuda, "Event"),
        "torch.cuda.Event.record": (torch.cuda.Event, "record"),
        "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
        "torch.cuda.Event.synchronize": (torch.cuda.Event, "synchronize"),
        "torch.Tensor.copy_": (torch.Tensor, "copy_"),
        "torch.Tensor.zero_": (torch.Tensor, "zero_"),
        "torch.Tensor.clone": (torch.Tensor, "clone"),
        "torch.Tensor.to": (torch.Tensor, "to"),
        "torch.equal": (torch, "equal"),
    }
    return slots


def snapshot_timers() -> dict[str, object]:
    """Identities of the functions the timing loop and the output checks rely on, taken before candidate code runs."""
    return {name: getattr(owner, attr) for name, (owner, attr) in _timer_slots().items()}


def replaced_timers(snapshot: dict[str, object]) -> list[str]:
    """Names of timing functions the candidate has monkey-patched since `snapshot` (HARNESS.md H1)."""
    now = _timer_slots()
    return sorted(name for name, (owner, attr) in now.items() if getattr(owner, attr, None) is not snapshot.get(name))
