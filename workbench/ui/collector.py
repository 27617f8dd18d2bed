"""Full garbage collections kept off the keys' path while the TUI runs.

CPython's collector scans every tracked object in a full (generation 2) collection. In the TUI process (the screen,
the session's state, the runtime's threads) that was 85-150 thousand objects, and a full collection took 46-87 ms of
wall time on the 2-core box with the tuner running: eight of them in 90 s, each landing on whatever the main thread
was doing, a key's action or frame included (session 30, benchmarks/RESULTS.md). Most of those objects live as long
as the app. So the survivors of each full collection are frozen (moved to the permanent generation, which later
collections skip), and the next full collection scans only what came since. Frozen objects freed by their reference
counts go as usual; a frozen cycle that becomes garbage would be kept, so every REFREEZE_S the freeze is lifted and
the next full collection reclaims such cycles (one long collection in that time instead of several a minute).
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

REFREEZE_S = 600.0
"""Seconds between two lifts of the freeze (each lets one full collection scan everything)."""


class FrozenSurvivors:
    """Installed by the app: freezes the survivors of each full collection, lifts the freeze every REFREEZE_S."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        """Seconds, for the refreeze period (a test's fake clock)."""
        self._lifted_at = clock()
        """When the freeze was last lifted (or the policy installed)."""
        self.installed = False
        """Whether the callback is in gc.callbacks."""

    def install(self) -> None:
        """Freeze what the process holds now (the app's start-up objects), then the survivors of each full
        collection. No collection first: it took about 55 ms a mount, and what garbage the freeze keeps is
        reclaimed by the first full collection after the freeze is lifted."""
        if not self.installed:
            gc.freeze()
            gc.callbacks.append(self._on_collection)
            self.installed = True

    def uninstall(self) -> None:
        """Stop freezing and unfreeze everything (the app is closing)."""
        if self.installed:
            gc.callbacks.remove(self._on_collection)
            gc.unfreeze()
            self.installed = False

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        now = self._clock()
        if now - self._lifted_at >= REFREEZE_S:
            gc.unfreeze()  # the next full collection sees every object again
            self._lifted_at = now
        else:
            gc.freeze()
