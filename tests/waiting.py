"""Waiting in tests for something another process does: poll a condition until it holds or time runs out."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], seconds: float, step: float = 0.02) -> bool:
    """Whether predicate() became true within `seconds` (checked once more at the end)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())
