"""The few numbers a session list shows, kept at the head of session.toml so listing never parses [state].

session.toml carries the whole derived state (every attempt's source included) for fast resume, which makes it
megabytes on a long run; `workbench sessions` and the review list need only a handful of fields. The checkpoint
writes them as a [summary] table ahead of [state], and the list reads the file only up to [state].
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Mapping

FIELDS = ("task", "agent", "created", "status", "attempts", "best", "best_speedup", "elapsed_s", "run_started_ts",
          "last_ts")
_STATE_HEADER = b"[state]"


def summarize(state: Mapping[str, Any]) -> dict[str, Any]:
    """The list fields of a folded state (SessionState.to_dict()); absent values are left out (TOML has no null)."""
    attempts = state.get("attempts") or {}
    best = state.get("best")
    if isinstance(attempts, Mapping):
        entry = attempts.get(str(best)) if best is not None else None
        best_speedup = entry.get("speedup") if isinstance(entry, Mapping) else None
        count = len(attempts)
    else:  # a caller's own state layout: keep what it says
        best_speedup, count = None, attempts if isinstance(attempts, int) else None
    out = {key: state.get(key) for key in FIELDS if key not in ("attempts", "best_speedup")}
    out.update(attempts=count, best_speedup=best_speedup)
    return {k: v for k, v in out.items() if v is not None}


def of(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The summary of a session.toml's content: its [summary] table, or one derived from [state] (older files)."""
    found = meta.get("summary")
    if isinstance(found, Mapping):
        return {**{k: meta[k] for k in ("task", "agent", "created") if k in meta}, **found}
    state = meta.get("state")
    summary = summarize(state) if isinstance(state, Mapping) else {}
    return {**{k: meta[k] for k in ("task", "agent", "created", "status") if k in meta}, **summary}


def read_head(path: Path) -> dict[str, Any] | None:
    """session.toml parsed only up to its [state] table, when a [summary] precedes it; None otherwise.

    Reads line by line and stops at [state], so a multi-megabyte state is neither read nor parsed.

    Raises:
        OSError: the file cannot be read.
        tomllib.TOMLDecodeError: the head is not valid TOML.
    """
    head = []
    with open(path, "rb") as f:
        for line in f:
            if line.rstrip() == _STATE_HEADER:
                break
            head.append(line)
        else:
            return None
    parsed = tomllib.loads(b"".join(head).decode("utf-8"))
    return parsed if isinstance(parsed.get("summary"), dict) else None
