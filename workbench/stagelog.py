"""An evaluation's steps as lines on a stream, so `workbench eval` is not silent for minutes.

A cold evaluation can spend most of its time on the trusted side: FLA's baseline autotunes for real on a GPU the
task recorded no choices for (207.7 s of a 234 s `eval kda --heldout` on an H100, 2026-12-07), and until this
printed nothing a user could not tell that from a hang. One line per kind of step and shape, the first time it
starts (seeds and repeats fold into it), with the seconds since the evaluation began.
"""

from __future__ import annotations

import time
from typing import Any, Callable, TextIO

SLOW_S = 5.0
"""A gap of at least this long since the previous line is shown on the next one, so a slow step stands out."""


def phase_of(stage: dict[str, Any]) -> str:
    """A service step as a fleet view shows it, its seed left out: "forward S1", "timing S2", "load"."""
    name = str(stage.get("stage", ""))
    return f"{name} {stage['shape']}" if stage.get("shape") else name


def describe(stage: dict[str, Any]) -> str:
    """phase_of, and whose step it is where the name alone does not say: "baseline K4", "timing K1 (candidate)"."""
    return phase_of(stage) + (" (candidate)" if stage.get("trusted") is False else "")


class StageLog:
    """Writes the steps the evaluation service announces as lines: `eval [  215.0 s] oracle K1  (+207.2 s)`.

    A phrase already written is not written again (the oracle and the candidate alternate once per seed); the gap
    since the previous line is appended when it is SLOW_S or more: the step before it is the one that took long.
    """

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic):
        self.stream = stream
        self.clock = clock
        self.start = clock()
        self._seen: set[str] = set()
        self._last_t = self.start

    def __call__(self, stage: dict[str, Any]) -> None:
        phrase = describe(stage)
        if phrase in self._seen:
            return
        self._seen.add(phrase)
        now = self.clock()
        gap = now - self._last_t
        after = f"  (+{gap:.1f} s)" if gap >= SLOW_S else ""
        self.stream.write(f"eval [{now - self.start:7.1f} s] {phrase}{after}\n")
        self.stream.flush()
        self._last_t = now
