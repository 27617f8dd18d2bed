"""The strategy ledger: what the agent planned, tried and learned, with evidence; journaled as ledger.updated.

A ledger is a plain list of dicts (the whole list travels in every ledger.updated event, and SessionState.ledger
holds the latest). Entry fields: ``id`` ("S1", "S2", ... never reused), ``strategy`` (one line: what the change
is), ``status`` (one of STATUSES), ``expected`` and ``actual`` (effect, free text), ``why`` (the reason for a
failure or a drop), ``attempts`` (attempt numbers that are its evidence) and ``evidence`` (what each of those
attempts showed: verdict, speedup, message).

The "already tried" rule (find_repeats) compares a new attempt with every *failed* strategy in three ways, from
strongest to weakest:

1. tag: the attempt was written for that strategy (its ``strategy`` param names the id);
2. code: the attempt's own change (lines it adds relative to its parent, whitespace-normalised, blank and
   comment-only lines ignored) largely re-does a change that failed: at least 60% of the failed attempt's added
   lines come back, and they make up at least half of the new change; the same code (ignoring comments and
   whitespace) always matches;
3. text: the attempt's note shares at least two content words and half of its content words with the failed
   strategy's one-line description.

Comparing changes rather than whole sources is what lets an agent *fix* a failed attempt (its child adds new
lines, not the failed ones) without a warning, while re-applying the same edit to a different base draws one.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Iterable

from workbench.session.state import Attempt, SessionState

STATUSES = ("planned", "trying", "succeeded", "failed", "partial", "dropped")
"""A strategy's life: planned -> trying -> succeeded | failed | partial | dropped."""

TEXT_FIELDS = ("strategy", "expected", "actual", "why")
"""Free-text fields a tool call may set."""

MAX_TEXT = 400
"""Longest free-text field kept; the ledger rides in every turn, so it must stay short."""

CODE_RECALL = 0.6
"""Share of a failed change's added lines that must come back for a code match."""
CODE_PRECISION = 0.5
"""Share of the new change that must be made of those lines."""
TEXT_JACCARD = 0.5
"""Share of note words a failed strategy's description must cover for a text match."""

_STOP = frozenset(
    "the a an and or of to in on for with from into by use using try trying than then this that these those "
    "it its is are be was were as at more less per not no".split()
)


class LedgerError(ValueError):
    """A ledger change that cannot be made (unknown id, bad status, duplicate); the message is for the agent."""


def _clean(text: Any) -> str:
    return " ".join(str(text).split())[:MAX_TEXT]


def find(ledger: list[dict[str, Any]], sid: str) -> dict[str, Any] | None:
    """The entry with id `sid` (case-insensitive), or None."""
    sid = sid.strip().upper()
    return next((e for e in ledger if e["id"].upper() == sid), None)


def _next_id(ledger: list[dict[str, Any]]) -> str:
    numbers = [int(e["id"][1:]) for e in ledger if re.fullmatch(r"S\d+", e["id"])]
    return f"S{max(numbers, default=0) + 1}"


def _status(value: Any) -> str:
    if value not in STATUSES:
        raise LedgerError(f"status must be one of {', '.join(STATUSES)}, not {value!r}")
    return value


def _attempt_numbers(values: Iterable[Any], state: SessionState | None) -> list[int]:
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise LedgerError(f"attempts must be attempt numbers, not {value!r}")
        if state is not None and value not in state.attempts:
            raise LedgerError(f"attempt {value} does not exist")
        if value not in out:
            out.append(value)
    return out


def add(ledger: list[dict[str, Any]], fields: dict[str, Any], state: SessionState | None = None
        ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return a new ledger with one more strategy, and that entry.

    Raises:
        LedgerError: no description, a bad status, unknown attempts, or a strategy already recorded under
            another id (same description, ignoring case and spacing).
    """
    text = _clean(fields.get("strategy", ""))
    if not text:
        raise LedgerError("a new strategy needs a one-line 'strategy' description")
    for entry in ledger:
        if entry["strategy"].lower() == text.lower():
            raise LedgerError(f"{entry['id']} already records this strategy ({entry['status']}); update it instead")
    entry = {
        "id": _next_id(ledger),
        "strategy": text,
        "status": _status(fields.get("status", "planned")),
        "expected": _clean(fields.get("expected", "")),
        "actual": _clean(fields.get("actual", "")),
        "why": _clean(fields.get("why", "")),
        "attempts": _attempt_numbers(fields.get("attempts", []), state),
        "evidence": [],
    }
    if state is not None:
        entry["evidence"] = [evidence_of(state.attempts[n]) for n in entry["attempts"]]
    return [*ledger, entry], entry


def update(ledger: list[dict[str, Any]], sid: str, fields: dict[str, Any], state: SessionState | None = None
           ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return a new ledger with entry `sid` changed (attempts are added to, never replaced), and that entry.

    Raises:
        LedgerError: unknown id, bad status, unknown attempts, or nothing to change.
    """
    old = find(ledger, sid)
    if old is None:
        known = ", ".join(e["id"] for e in ledger) or "none yet"
        raise LedgerError(f"no strategy {sid!r} (ids: {known})")
    entry = {**old, "attempts": list(old["attempts"]), "evidence": list(old["evidence"])}
    changed = False
    if "status" in fields:
        entry["status"], changed = _status(fields["status"]), True
    for key in TEXT_FIELDS:
        if key in fields:
            entry[key], changed = _clean(fields[key]), True
    for n in _attempt_numbers(fields.get("attempts", []), state):
        if n not in entry["attempts"]:
            entry["attempts"].append(n)
            if state is not None:
                entry["evidence"].append(evidence_of(state.attempts[n]))
            changed = True
    if not changed:
        raise LedgerError(f"update {entry['id']}: give status, attempts or a text field to change")
    return [entry if e is old else e for e in ledger], entry


_SESSION_PATH = re.compile(r"\S*/(attempts/\d{4}/)")


def short_paths(text: str) -> str:
    """Evaluator messages name files by absolute path; inside a session 'attempts/0007/kernel.py' says the same."""
    return _SESSION_PATH.sub(r"\1", text)


def evidence_of(attempt: Attempt) -> dict[str, Any]:
    """What an attempt showed, frozen at the time it is linked (a later re-evaluation does not rewrite it)."""
    out: dict[str, Any] = {"attempt": attempt.n, "verdict": attempt.verdict or "not evaluated"}
    if attempt.speedup is not None:
        out["speedup"] = round(attempt.speedup, 4)
    if attempt.verdict not in (None, "ok") and attempt.message:
        out["message"] = short_paths(attempt.message)[:200]
    return out


def link(ledger: list[dict[str, Any]], sid: str, attempt: Attempt) -> list[dict[str, Any]] | None:
    """The ledger with `attempt`'s outcome added as evidence to `sid`, or None if there is no such strategy.

    An attempt already listed gets its evidence refreshed (it was linked before it was evaluated).
    """
    entry = find(ledger, sid)
    if entry is None:
        return None
    new = {**entry, "attempts": list(entry["attempts"]), "evidence": [
        e for e in entry["evidence"] if e.get("attempt") != attempt.n]}
    if attempt.n not in new["attempts"]:
        new["attempts"].append(attempt.n)
    new["evidence"].append(evidence_of(attempt))
    return [new if e is entry else e for e in ledger]


def failed(ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Strategies that failed: the ones compaction must never drop and a repeat of which draws a warning."""
    return [e for e in ledger if e.get("status") == "failed"]


def line(entry: dict[str, Any]) -> str:
    """One line for the per-turn state block: id, status, description, outcome and evidence."""
    parts = [f"{entry['id']} [{entry['status']}] {entry['strategy']}"]
    if entry.get("expected"):
        parts.append(f"expected: {entry['expected']}")
    if entry.get("actual"):
        parts.append(f"actual: {entry['actual']}")
    if entry.get("why"):
        parts.append(f"why: {entry['why']}")
    if entry.get("evidence"):
        shown = [_evidence_text(e) for e in entry["evidence"][-4:]]
        more = f" (+{len(entry['evidence']) - 4} more)" if len(entry["evidence"]) > 4 else ""
        parts.append("evidence: " + ", ".join(shown) + more)
    elif entry.get("attempts"):
        parts.append("attempts: " + ", ".join(f"#{n}" for n in entry["attempts"]))
    return " | ".join(parts)


def _evidence_text(e: dict[str, Any]) -> str:
    text = f"#{e['attempt']} {e['verdict']}"
    if e.get("speedup") is not None:
        text += f" {e['speedup']:.3g}x"
    return text


# -- the "already tried" rule ------------------------------------------------------------------------
def _norm_lines(text: str) -> list[str]:
    out = []
    for raw in text.splitlines():
        line_ = " ".join(raw.split())
        if line_ and not line_.startswith("#"):
            out.append(line_)
    return out


def added_lines(source: str, parent_source: str | None) -> set[str]:
    """Normalised lines `source` adds relative to its parent (all its lines when there is no parent)."""
    new = _norm_lines(source)
    if parent_source is None:
        return set(new)
    old = _norm_lines(parent_source)
    added: set[str] = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            added.update(new[j1:j2])
    return added


def _change(state: SessionState, attempt: Attempt) -> set[str]:
    parent = state.attempts.get(attempt.parent) if attempt.parent is not None else None
    return added_lines(attempt.source, parent.source if parent else None)


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9_]+", text.lower()) if len(w) >= 3 and w not in _STOP}


def find_repeats(state: SessionState, attempt: Attempt, ledger: list[dict[str, Any]] | None = None
                 ) -> list[dict[str, Any]]:
    """Warnings for an attempt that repeats a failed strategy, each citing that strategy's evidence.

    Args:
        state: the session (for parents and the evidence attempts' sources).
        attempt: the attempt about to be evaluated.
        ledger: defaults to state.ledger.

    Returns:
        One dict per failed strategy matched: {'strategy', 'rule' ('tag' | 'code' | 'text'), 'message'}.
    """
    ledger = state.ledger if ledger is None else ledger
    warnings = []
    mine = None
    for entry in failed(ledger):
        rule = detail = None
        if str(attempt.params.get("strategy", "")).upper() == entry["id"].upper():
            rule, detail = "tag", f"attempt {attempt.n} is tagged {entry['id']}"
        if rule is None:
            for n in entry["attempts"]:
                other = state.attempts.get(n)
                if other is None or other.n == attempt.n:
                    continue
                if other.sha256 == attempt.sha256 or _norm_lines(other.source) == _norm_lines(attempt.source):
                    rule, detail = "code", f"attempt {attempt.n} is the same code as attempt {n}"
                    break
                theirs = _change(state, other)
                if not theirs:
                    continue
                mine = _change(state, attempt) if mine is None else mine
                common = len(mine & theirs)
                if mine and common / len(theirs) >= CODE_RECALL and common / len(mine) >= CODE_PRECISION:
                    rule = "code"
                    detail = f"attempt {attempt.n} re-applies {common} of the {len(theirs)} lines attempt {n} added"
                    break
        if rule is None and attempt.note:
            note, theirs_w = _words(attempt.note), _words(entry["strategy"])
            common_w = note & theirs_w
            if note and len(common_w) >= 2 and len(common_w) / len(note) >= TEXT_JACCARD:
                rule = "text"
                detail = f"attempt {attempt.n}'s note shares {', '.join(sorted(common_w))} with it"
        if rule is None:
            continue
        evidence = ", ".join(_evidence_text(e) + (f" ({e['message']})" if e.get("message") else "")
                             for e in entry["evidence"][-3:]) or "no attempts linked"
        why = f"; why: {entry['why']}" if entry.get("why") else ""
        warnings.append({
            "strategy": entry["id"],
            "rule": rule,
            "message": f"{detail}: {entry['id']} '{entry['strategy']}' already FAILED{why}; evidence: {evidence}",
        })
    return warnings
