"""Checks made inside the candidate process while it runs: which forbidden modules it managed to load."""

from __future__ import annotations

from typing import Iterable


def _banned(module: str, banned: Iterable[str]) -> str | None:
    for name in banned:
        if module == name or module.startswith(name + "."):
            return name
    return None


def forbidden_modules(loaded: Iterable[str], banned: Iterable[str]) -> list[str]:
    """The top-level banned packages among `loaded` module names (e.g. a `sys.modules` diff), sorted.

    Catches what static checks cannot see: imports built from strings, imports done by a helper module.
    """
    banned = list(banned)
    hits = {hit for mod in loaded if (hit := _banned(mod, banned))}
    return sorted(hits)


def _timer_slots() -> dict[str, tuple[object, str]]:
    import statistics
    import time

    import torch

    slots: dict[str, tuple[object, str]] = {
        "time.perf_counter": (time, "perf_counter"),
        "statistics.median": (statistics, "median"),
        "statistics.quantiles": (statistics, "quantiles"),
    }
    if torch.cuda.is_available():
        slots.update(
            {
                "torch.cuda.synchronize": (torch.cuda, "synchronize"),
                "torch.cuda.Event": (torch.cuda, "Event"),
                "torch.cuda.Event.record": (torch.cuda.Event, "record"),
                "torch.cuda.Event.elapsed_time": (torch.cuda.Event, "elapsed_time"),
            }
        )
    return slots


def snapshot_timers() -> dict[str, object]:
    """Identities of the functions the timing loop relies on, taken before candidate code runs."""
    return {name: getattr(owner, attr) for name, (owner, attr) in _timer_slots().items()}


def replaced_timers(snapshot: dict[str, object]) -> list[str]:
    """Names of timing functions the candidate has monkey-patched since `snapshot` (HARNESS.md H1)."""
    now = _timer_slots()
    return sorted(name for name, (owner, attr) in now.items() if getattr(owner, attr, None) is not snapshot.get(name))
