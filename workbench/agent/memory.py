"""The agent's working memory: a fold of journal events into the context window, and its compaction.

SessionMemory is the window both backends share. For an LLM backend ("messages" kind) its entries are the
conversation: each llm.request adds the user message(s) it carried (a delta, never the whole context) and each
successful llm.response adds the assistant message. For the tuner ("tools" kind) each tool.call and tool.result
adds a one-line entry. A memory.compacted event replaces every entry up to a seq by a structured summary.

A run of several branches (run --branches) keeps one window per branch: the model and tool events a branch
journals carry its number, and each branch's memory folds only its own (events without one belong to branch 0).
The results of evaluations a branch queued that came in after its evaluate call returned are kept as `arrived`
until its next request carries them.

Compaction is deterministic: the summary is written from the session state (best result, strategy ledger,
attempts, failures, profiler, instructions in force) and the model's own latest plan, with no extra model call,
and is journaled with the range it replaced, what was dropped and an audit that the goal, every failed strategy,
the best result and every persistent instruction survived. It never rewrites history: the journal keeps every
replaced event, and the memory at any seq is the fold of the journal up to it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from workbench.agent import ledger as ledger_mod
from workbench.agent.prompts import (
    attempt_line,
    best_line,
    nudge_line,
    persistent_nudges,
    profile_headline,
    short_paths,
)
from workbench.session.state import SessionState

if TYPE_CHECKING:
    from workbench.session.store import SessionFiles

CHARS_PER_TOKEN = 3.5
"""A conservative estimate for code-heavy English (real tokenizers give 3.5-4.5 chars per token)."""

KEEP_FRACTION = 0.5
"""After a compaction, the kept recent turns fill at most this share of what the budget leaves them."""

DEFAULT_CONTEXT_TOKENS = 100_000
"""Compaction budget when neither the run nor the backend sets one."""

BRANCH_EVENTS = frozenset({"llm.request", "llm.response", "tool.call", "tool.result", "memory.compacted",
                           "eval.finished", "eval.failed"})
"""Event types that belong to one branch (their 'branch', 0 when absent); the others are shared by all."""

RECENT_ATTEMPTS = 12
"""Attempts listed one per line in a summary (older ones are counted)."""
RECENT_FAILURES = 8
DROPPED_LINES = 60


def estimate_tokens(value: Any, source_chars: dict[int, int] | None = None) -> int:
    """Estimated tokens of a string or of message content blocks (source references count their source)."""
    if isinstance(value, str):
        return math.ceil(len(value) / CHARS_PER_TOKEN)
    chars = 0
    for block in value if isinstance(value, list) else [value]:
        if not isinstance(block, dict):
            chars += len(str(block))
            continue
        chars += 12  # per-block framing
        kind = block.get("type")
        if "source_of" in block:
            chars += (source_chars or {}).get(block["source_of"], 0)
        elif kind == "text":
            chars += len(block.get("text", ""))
        elif kind == "tool_use":
            chars += len(block.get("name", "")) + len(json.dumps(block.get("input", {})))
        elif kind == "tool_result":
            content = block.get("content", "")
            chars += (len(content) if isinstance(content, str)
                      else estimate_tokens(content, source_chars) * CHARS_PER_TOKEN)
        else:
            chars += len(json.dumps(block))
    return math.ceil(chars / CHARS_PER_TOKEN)


@dataclass
class Entry:
    """One message (or tuner line) in the window."""

    seq: int
    """The journal event it came from."""
    role: str
    """'user' or 'assistant'."""
    content: list[dict[str, Any]]
    """Content blocks as journaled (attempt sources still as references)."""
    tokens: int
    turn: int = 0


class SessionMemory:
    """The context window as a fold of journal events (see the module docstring)."""

    def __init__(self, kind: str = "tools", branch: int = 0) -> None:
        self.kind = kind
        """'messages' (LLM conversation from llm.* events) or 'tools' (tool.call/tool.result lines)."""
        self.branch = branch
        """The branch whose events this window folds."""
        self.arrived: list[int] = []
        """Attempts whose evaluation, queued by this branch's calls, finished after the call had returned and
        since the branch's last request (the next request tells the model)."""
        self.entries: list[Entry] = []
        self.summary = ""
        """The latest compaction summary ('' before the first compaction)."""
        self.summary_tokens = 0
        self.compacted_upto = 0
        """Last seq replaced by the summary."""
        self.compactions = 0
        self.plan = ""
        """The model's latest stated plan carried by the summary."""
        self.turn = 0
        """llm.request events so far (the number of the latest request)."""
        self.pending = False
        """An llm.request is journaled and no successful llm.response has followed it."""
        self.last_request_seq = 0
        self.response: dict[str, Any] | None = None
        """The latest successful llm.response: {'seq', 'content', 'turn'}."""
        self.silent = 0
        """Successful responses in a row without a tool call."""
        self.calls: dict[str, dict[str, Any]] = {}
        """Tool calls made for the latest response, by tool_use id: {'call', 'result', 'result_seq'}."""
        self.revoked: list[tuple[int, str]] = []
        """(seq, nudge id) of each revocation, so the next request can tell the model."""
        self.run_started_seq = 0
        self.source_chars: dict[int, int] = {}
        """Length of every attempt's source, to size source references without expanding them."""
        self._refs: dict[str, str] = {}

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def load(cls, files: "SessionFiles", state: SessionState, kind: str, branch: int = 0) -> "SessionMemory":
        """Rebuild a branch's window for resume: its latest summary (from the checkpointed state) plus the journal
        after it.

        Only events after the last compacted range are read, so the cost follows the window, not the session.
        """
        memory = cls(kind, branch)
        memory.source_chars = {n: len(a.source) for n, a in state.attempts.items()}
        start = 1
        # Checkpoints from before branches keep one compaction, which is branch 0's.
        compaction = state.memories.get(str(branch)) or (state.memory if branch == 0 and not state.memories else {})
        if compaction.get("replaced"):
            memory._compacted(compaction)
            start = memory.compacted_upto + 1
        if state.last_seq >= start:
            for event in files.read_events(start_seq=start):
                if event.seq > state.last_seq:
                    break
                memory.apply(event.to_dict())
        return memory

    @classmethod
    def fold(cls, events: Iterable[dict[str, Any]], kind: str) -> "SessionMemory":
        """The window after `events` (journal records as dicts), from an empty session."""
        memory = cls(kind)
        for event in events:
            memory.apply(event)
        return memory

    def apply(self, event: dict[str, Any]) -> None:
        """Fold one journal event (as a dict) into the window."""
        kind, data, seq = event["type"], event.get("data") or {}, event["seq"]
        if kind in BRANCH_EVENTS and data.get("branch", 0) != self.branch:
            return
        if kind == "attempt.written":
            self.source_chars[data["attempt"]] = len(data.get("source", ""))
        elif kind == "memory.compacted":
            self._compacted(data)
        elif kind == "run.started":
            self.run_started_seq = seq
        elif kind == "nudge.acked" and data.get("revoked"):
            self.revoked.append((seq, data["id"]))
        elif self.kind == "messages":
            self._apply_message_event(kind, data, seq)
        elif kind == "tool.call":
            args = json.dumps(data.get("args", {}), sort_keys=True)[:160]
            self._add(seq, "assistant", [{"type": "text", "text": f"call {data.get('tool')} {args}"}])
        elif kind == "tool.result":
            text = data.get("summary") or data.get("error") or ("ok" if data.get("ok") else "failed")
            self._add(seq, "user", [{"type": "text", "text": f"{data.get('tool')}: {text}"}])

    def _apply_message_event(self, kind: str, data: dict[str, Any], seq: int) -> None:
        if kind == "llm.request":
            self.turn = int(data.get("turn", self.turn + 1))
            for message in data.get("delta", []):
                self._add(seq, message["role"], message["content"])
            self.pending, self.last_request_seq = True, seq
            self.arrived = []  # the request's delta carried them
        elif kind in ("eval.finished", "eval.failed") and data.get("call"):
            final = kind == "eval.failed" or data.get("check") == "heldout" or not data.get("pending")
            if final and data["attempt"] not in self.arrived:
                self.arrived.append(data["attempt"])
        elif kind == "llm.response" and data.get("ok", True) and "content" in data:
            content = data["content"]
            self._add(seq, "assistant", content)
            self.pending = False
            self.response = {"seq": seq, "content": content, "turn": data.get("turn", self.turn)}
            self.calls, self._refs = {}, {}
            has_tools = any(b.get("type") == "tool_use" for b in content)
            self.silent = 0 if has_tools else self.silent + 1
        elif kind == "tool.call" and data.get("ref"):
            self.calls[data["ref"]] = {"call": data, "result": None, "result_seq": 0}
            self._refs[data["call_id"]] = data["ref"]
        elif kind == "tool.result":
            reported = {r["attempt"] for r in (data.get("data") or {}).get("reports", [])}
            if data.get("tool") == "evaluate" and "verdict" in (data.get("data") or {}):
                reported.add(data["data"]["attempt"])
            self.arrived = [n for n in self.arrived if n not in reported]
            ref = self._refs.get(data.get("call_id", ""))
            if ref is not None:
                self.calls[ref]["result"], self.calls[ref]["result_seq"] = data, seq

    def _add(self, seq: int, role: str, content: list[dict[str, Any]]) -> None:
        self.entries.append(Entry(seq, role, content, estimate_tokens(content, self.source_chars), self.turn))

    def _compacted(self, data: dict[str, Any]) -> None:
        upto = int(data["replaced"][1])
        self.entries = [e for e in self.entries if e.seq > upto]
        self.summary = data.get("summary", "")
        self.summary_tokens = estimate_tokens(self.summary)
        self.compacted_upto = upto
        self.plan = data.get("plan", self.plan)
        self.compactions = int(data.get("number", self.compactions + 1))
        # A resume reads only the events after the compacted range: carry the counters that lie inside it.
        self.turn = max(self.turn, int(data.get("turn", 0)))
        self.last_request_seq = max(self.last_request_seq, int(data.get("last_request_seq", 0)))

    # -- views ---------------------------------------------------------------------------------
    def tokens(self) -> int:
        """Estimated tokens of the window (summary plus entries), without the pinned prefix."""
        return self.summary_tokens + sum(e.tokens for e in self.entries)

    def tool_uses(self) -> list[dict[str, Any]]:
        """The tool_use blocks of the latest response, in order."""
        if self.response is None:
            return []
        return [b for b in self.response["content"] if b.get("type") == "tool_use"]

    def cut_for(self, keep_tokens: int) -> int | None:
        """The last seq to replace so that the kept recent entries fit `keep_tokens`, or None if nothing can go.

        A cut falls just before an assistant entry (for messages, a model reply), so the kept part starts with a
        reply whose tool results follow it and the summary takes the place of the user turn before it. The
        latest reply is always kept: the next request answers its tool calls.
        """
        starts = [i for i, e in enumerate(self.entries) if e.role == "assistant"]
        if not starts:
            return None
        suffix = [0] * (len(self.entries) + 1)
        for i in range(len(self.entries) - 1, -1, -1):
            suffix[i] = suffix[i + 1] + self.entries[i].tokens
        chosen = starts[-1]
        for i in starts:
            if suffix[i] <= keep_tokens:
                chosen = i
                break
        if chosen == 0:
            return None
        return self.entries[chosen].seq - 1


# -- compaction --------------------------------------------------------------------------------------
def latest_plan(entries: Iterable[Entry], fallback: str = "") -> str:
    """The text of the latest assistant entry that has any: the model's own words about what it is doing."""
    plan = fallback
    for entry in entries:
        if entry.role != "assistant":
            continue
        text = " ".join(b.get("text", "") for b in entry.content if b.get("type") == "text").strip()
        if text:
            plan = " ".join(text.split())[:600]
    return plan


def summarize(state: SessionState, plan: str = "", *, replaced: tuple[int, int] = (0, 0), number: int = 1) -> str:
    """The structured summary that replaces older turns (deterministic: same state, same text).

    Failed strategies and persistent instructions are listed in full and never shortened, because losing them
    is exactly how long runs go wrong; attempts and failures are capped to the most recent ones.
    """
    out = [f"MEMORY (compaction #{number}: replaces journal seq {replaced[0]}-{replaced[1]})",
           "Older turns of this session were replaced by this summary. The goal contract (system prompt) and "
           "the <state> block of the latest message are current.", ""]
    out.append(best_line(state))
    failed = ledger_mod.failed(state.ledger)
    out.append("")
    out.append("FAILED strategies (do not retry without a new reason):" if failed else "Failed strategies: none")
    out.extend(f"- {ledger_mod.line(e)}" for e in failed)
    others = [e for e in state.ledger if e.get("status") != "failed"]
    if others:
        out.append("Other strategies:")
        out.extend(f"- {ledger_mod.line(e)}" for e in others)
    attempts = [state.attempts[n] for n in sorted(state.attempts)]
    out.append("")
    if attempts:
        verdicts: dict[str, int] = {}
        for a in attempts:
            verdicts[a.verdict or "not evaluated"] = verdicts.get(a.verdict or "not evaluated", 0) + 1
        counts = ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items()))
        out.append(f"What was tried: {len(attempts)} attempts ({counts}); tool calls {state.tool_calls}.")
        out.append("Recent attempts:")
        out.extend(f"  {attempt_line(a)}" for a in attempts[-RECENT_ATTEMPTS:])
        failures = [a for a in attempts if a.verdict not in (None, "ok")][-RECENT_FAILURES:]
        if failures:
            out.append("What failed and why (latest):")
            out.extend(f"  #{a.n} {a.verdict}: {short_paths(a.message)[:200]}" for a in failures)
    else:
        out.append("What was tried: no attempt written yet.")
    out.append("")
    out.append(profile_headline(state) or "Profiler: nothing profiled yet.")
    nudges = persistent_nudges(state)
    out.append("")
    if nudges:
        out.append("Instructions from the person in force (persistent, until revoked):")
        out.extend(f"- {nudge_line(n)}" for n in nudges)
    else:
        out.append("Instructions from the person in force: none")
    if plan:
        out.append("")
        out.append(f"Your plan before this compaction: {plan}")
    return "\n".join(out)


def audit(summary: str, state: SessionState) -> dict[str, Any]:
    """Check that what a long run must never lose survives the compaction.

    The goal survives by construction (it is pinned in the system prompt, outside anything compaction touches);
    the best result, every failed strategy (id and description) and every persistent instruction (full text)
    must appear in the summary.
    """
    best = state.best_attempt
    failed = {e["id"]: f"- {e['id']} [failed] {e['strategy']}" in summary for e in ledger_mod.failed(state.ledger)}
    nudges = {n["id"]: n["text"] in summary for n in persistent_nudges(state)}
    result = {
        "goal_pinned": bool(state.goal),
        "best": best is None or f"best: attempt {best.n}" in summary,
        "failed_strategies": failed,
        "persistent_nudges": nudges,
    }
    result["ok"] = result["goal_pinned"] and result["best"] and all(failed.values()) and all(nudges.values())
    return result


def describe_dropped(entries: list[Entry]) -> list[str]:
    """What a compaction removed from the window, one short line per dropped model turn (capped)."""
    lines: list[str] = []
    for entry in entries:
        if entry.role != "assistant":
            continue
        calls = []
        for block in entry.content:
            if block.get("type") == "tool_use":
                args = json.dumps(block.get("input", {}), sort_keys=True)
                calls.append(f"{block.get('name')}{args[:60]}")
            elif block.get("type") == "text" and block.get("text", "").startswith("call "):
                calls.append(block["text"][5:70])
        said = " ".join(b.get("text", "") for b in entry.content if b.get("type") == "text" and
                        not b.get("text", "").startswith("call ")).strip()
        head = f"turn {entry.turn} @{entry.seq}" if entry.turn else f"@{entry.seq}"
        text = f"{head}: " + (", ".join(calls) or "(no tool call)")
        if said:
            text += f' - "{" ".join(said.split())[:60]}"'
        lines.append(text[:160])
    if len(lines) > DROPPED_LINES:
        more = len(lines) - DROPPED_LINES
        lines = lines[: DROPPED_LINES // 2] + [f"... {more} more turns ..."] + lines[-DROPPED_LINES // 2:]
    return lines


def plan_compaction(memory: SessionMemory, state: SessionState, *, limit: int, overhead: int) -> dict[str, Any] | None:
    """The memory.compacted event data when the context passes `limit`, else None.

    Args:
        memory: the window.
        state: the session state the summary is written from.
        limit: the context budget in estimated tokens.
        overhead: tokens outside the window that count against the budget (pinned prefix, the pending delta).
    """
    before = overhead + memory.tokens()
    if before <= limit:
        return None
    number = memory.compactions + 1
    start = memory.compacted_upto + 1  # the summary covers the session from its start, not just the window
    draft = summarize(state, memory.plan, replaced=(start, state.last_seq), number=number)
    keep = max(0, int((limit - overhead - estimate_tokens(draft)) * KEEP_FRACTION))
    upto = memory.cut_for(keep)
    if upto is None:
        return None
    dropped = [e for e in memory.entries if e.seq <= upto]
    plan = latest_plan(dropped, memory.plan)
    summary = summarize(state, plan, replaced=(start, upto), number=number)
    kept = sum(e.tokens for e in memory.entries if e.seq > upto)
    return {
        "number": number,
        "kind": memory.kind,
        "replaced": [start, upto],
        "summary": summary,
        "plan": plan,
        "dropped": describe_dropped(dropped),
        "entries_dropped": len(dropped),
        "audit": audit(summary, state),
        "tokens_before": before,
        "tokens_after": overhead + estimate_tokens(summary) + kept,
        "limit": limit,
        "turn": memory.turn,
        "last_request_seq": memory.last_request_seq,
    }
