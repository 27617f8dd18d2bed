"""SessionHistory: one session read back from its journal for review, with what the agent knew at each attempt.

No Textual here: `workbench review ID --export` uses this module without a terminal, and review mode runs
load_history in a thread worker.

Speed. Review must open a 100,000-event session in well under two seconds on a small machine, and parsing
every line's JSON is most of that. The review needs the whole hash chain checked (a resume trusts its
checkpoint anchor; review is where damage in the anchored prefix is found), but it does not need the data of
the bulk event types (tool calls, their results, model requests, checkpoint notes), which change nothing it
shows beyond a count. So lines of those types are checked from their fixed fields, as journal.chain does for
lines before a start_seq, and only the rest are decoded and folded with the core's own `apply`. Ledger updates,
which repeat the whole ledger each time, are kept as raw lines and decoded only for the steps the person opens.
TODO(core): a `types=` filter on journal.read_events would let this module drop its copy of Scan.events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from workbench.journal import JournalError, read_events
from workbench.journal.chain import Scan, start_chain
from workbench.session.state import SessionState, apply

SKIPPED_TYPES = frozenset({"tool.call", "tool.result", "llm.request", "checkpoint.written"})
"""Event types review checks but does not decode: only their count (and the tool-call count) is used."""

LAZY_TYPES = frozenset({"ledger.updated"})
"""Event types kept as raw lines and decoded when first looked at: each carries the whole ledger, so they are a
large share of a journal's bytes, and a step's ledger is needed only when the person selects that step."""

_TYPE_KEY = b'"type": "'
"""Where the writer's fixed layout puts the type; a line without it is decoded in full (and checked)."""


class HistoryError(Exception):
    """A session that cannot be reviewed: unknown id, no journal, a broken journal; str() is one line."""


class LedgerLine:
    """One ledger.updated line, decoded on first use (steps with no ledger change between them share one)."""

    __slots__ = ("_raw", "_ledger")

    def __init__(self, raw: bytes | None = None, ledger: list[dict[str, Any]] | None = None) -> None:
        self._raw = raw
        self._ledger = ledger

    def value(self) -> list[dict[str, Any]]:
        """The ledger the line holds, as apply() would set it."""
        if self._ledger is None:
            data = json.loads(self._raw or b"{}").get("data") or {}
            self._ledger = list(data.get("ledger", []))
            self._raw = None
        return self._ledger


@dataclass(frozen=True)
class Step:
    """What the agent knew at the end of one attempt's step: the fold up to the next attempt.written."""

    n: int
    """The attempt this step belongs to."""
    seq: int
    """Last seq folded into this snapshot."""
    ledger_line: LedgerLine
    """The strategy ledger then, decoded when first read (see `ledger`)."""
    memory: dict[str, Any]
    """The latest memory.compacted data then."""
    nudges: list[dict[str, Any]]
    """Every nudge received by then, with its acked/active flags as they were (a copy: apply() edits flags)."""
    profile: dict[str, Any]
    """The latest profile.finished data then."""

    @property
    def ledger(self) -> list[dict[str, Any]]:
        """The strategy ledger at the end of the step."""
        return self.ledger_line.value()


@dataclass
class SessionHistory:
    """A whole session for review: the final state, one Step per attempt, every profile by attempt."""

    folder: Path
    """The session folder."""
    state: SessionState
    """The state after the last event (tool-call intents are counted, not tracked: in_flight stays empty)."""
    steps: dict[int, Step] = field(default_factory=dict)
    """Attempt number -> the snapshot at the end of its step."""
    profiles: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Attempt number -> its profile.finished data, merged (kernel tables from an evaluation, then ncu metrics)."""

    @property
    def id(self) -> str:
        """The session id (the folder name when the journal lacks session.created)."""
        return self.state.id or self.folder.name

    @property
    def order(self) -> list[int]:
        """Attempt numbers in the order they were written."""
        return sorted(self.state.attempts)

    def state_at(self, n: int) -> SessionState:
        """A SessionState carrying the goal, budget, ledger, memory and nudges as they were after attempt n.

        Only what the goal/ledger panel reads is filled in; it is a view for display, not a state to fold onto.
        """
        step = self.steps[n]
        final = self.state
        return SessionState(
            id=final.id, task=final.task, agent=final.agent, model=final.model, device=final.device,
            goal=final.goal, budget=final.budget, ledger=step.ledger, memory=step.memory, nudges=step.nudges,
            profile=step.profile, last_seq=step.seq,
        )

    def step_range(self, n: int) -> tuple[int, int]:
        """(first seq, last seq) of attempt n's step: from its attempt.written to the event before the next one."""
        attempt = self.state.attempts[n]
        return attempt.written_seq, self.steps[n].seq


def resolve_session_dir(root: Path, session_id: str) -> Path:
    """The folder of session `session_id` under `root`: an exact id, or a prefix naming exactly one.

    Raises:
        HistoryError: no sessions folder, not an id, unknown (near matches named), or an ambiguous prefix.
    """
    from workbench.session import SessionError, SessionStore

    root = Path(root)
    if not root.is_dir():
        raise HistoryError(f"no sessions folder at {root}")
    try:
        return root / SessionStore(root).resolve(session_id)
    except SessionError as exc:
        raise HistoryError(str(exc)) from None


def _type_of(raw: bytes) -> str | None:
    start = raw.find(_TYPE_KEY, 0, 96)
    if start < 0:
        return None
    start += len(_TYPE_KEY)
    end = raw.find(b'"', start)
    return raw[start:end].decode("ascii", "replace") if end > 0 else None


def _scan(path: Path) -> Iterator[tuple[str | None, dict[str, Any] | None, int, bytes]]:
    """Yield (type, record or None when not decoded, seq, line) for every complete line, checking the whole chain.

    A torn final line (a live writer mid-line, or a crash) is skipped, not an error; a bad line with complete
    lines after it is corruption. Bulky or lazily shown types are checked but not decoded.
    """
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise HistoryError(f"{path}: no journal here (not a session folder?)") from None

    def wanted(raw: bytes) -> bool:
        kind = _type_of(raw)
        return kind is None or (kind not in SKIPPED_TYPES and kind not in LAZY_TYPES)

    with f:
        chain, _ = start_chain(f, path, None, verify=True)
        for raw, event in Scan(f, chain).lines(wanted):
            if event is not None:
                yield event.type, event.to_dict(), chain.seq, raw
            else:
                yield _type_of(raw), None, chain.seq, raw


def load_history(folder: Path) -> SessionHistory:
    """Read a session's journal once and build its history (call it from a worker, never the event loop).

    Raises:
        HistoryError: no journal, or a journal that is corrupt (the line is named).
    """
    folder = Path(folder)
    state = SessionState()
    history = SessionHistory(folder, state)
    current: int | None = None
    ledger = LedgerLine(ledger=[])
    nudges_copy: list[dict[str, Any]] = []
    nudges_changed = False

    def close_step(seq: int) -> None:
        nonlocal nudges_copy, nudges_changed
        if current is None:
            return
        if nudges_changed:
            nudges_copy = [dict(n) for n in state.nudges]
            nudges_changed = False
        history.steps[current] = Step(current, seq, ledger, state.memory, nudges_copy, state.profile)

    try:
        for kind, record, seq, raw in _scan(folder / "events.jsonl"):
            if record is None:
                state.events += 1
                state.last_seq = seq
                if kind == "tool.call":
                    state.tool_calls += 1
                elif kind in LAZY_TYPES:
                    ledger = LedgerLine(raw)
                continue
            if kind == "attempt.written":
                close_step(seq - 1)
                current = record["data"].get("attempt")
            apply(state, record)
            if kind == "ledger.updated":
                ledger = LedgerLine(ledger=state.ledger)
            elif kind in ("nudge.received", "nudge.acked"):
                nudges_changed = True
            elif kind == "profile.finished" and isinstance(record["data"].get("attempt"), int):
                n = record["data"]["attempt"]
                history.profiles[n] = {**history.profiles.get(n, {}), **record["data"]}
        close_step(state.last_seq)
        state.ledger = ledger.value()
    except JournalError as exc:
        raise HistoryError(str(exc)) from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise HistoryError(f"{folder}: an event has an unexpected shape ({type(exc).__name__}: {exc})") from None
    return history


def read_range(folder: Path, first: int, last: int) -> list[dict[str, Any]]:
    """The events with first <= seq <= last, decoded in full (for the event list of one attempt's step).

    The chain was verified when the history was loaded, so this read only checks seq order.

    Raises:
        HistoryError: the journal is gone or no longer readable.
    """
    out: list[dict[str, Any]] = []
    try:
        for event in read_events(Path(folder) / "events.jsonl", start_seq=first, verify=False):
            if event.seq > last:
                break
            out.append(event.to_dict())
    except JournalError as exc:
        raise HistoryError(str(exc)) from None
    return out
