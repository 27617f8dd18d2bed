"""Plain-text formatting of numbers, goals and journal events for the UI; no widgets, so it is tested directly."""

from __future__ import annotations

import json
import textwrap
from datetime import datetime
from typing import Any, Callable, Mapping

from workbench.journal import events as ev
from workbench.journal.events import EVENT_TYPES
from workbench.session.state import parse_ts

DASH = "–"
"""Shown where a value is missing (not evaluated, failed shape, no baseline)."""

TYPE_WIDTH = max(len(kind) for kind in EVENT_TYPES)
"""The event type column is as wide as the longest type, so summaries line up."""

LINE_LIMIT = 400
"""Longest log line kept: the event log scrolls sideways, but a kernel's worth of text on one line helps nobody."""


def ms(value: float | None) -> str:
    """Milliseconds with three significant digits (0.0283, 1.23, 123, 1,234)."""
    if value is None:
        return DASH
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if value >= 0.001 else f"{value:.2e}"


def speedup(value: float | None) -> str:
    """A speedup factor as '1.63×'."""
    return DASH if value is None else f"{value:.2f}×"


def rel_err(value: float | None) -> str:
    """A relative error in scientific notation: tolerances span 1e-2 to 1e-6."""
    return DASH if value is None else f"{value:.1e}"


def duration(seconds: float) -> str:
    """Running time as H:MM:SS; long runs are the point, so hours are always shown."""
    total = max(0, int(seconds))
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"


def clock(ts: str) -> str:
    """A journal timestamp (UTC) as local HH:MM:SS, which is what the person's other clocks show."""
    try:
        return parse_ts(ts).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return ts[:8]


def now_from(frozen: str | None) -> datetime | None:
    """The UI's 'now': the frozen clock when set (tests), else None meaning the real clock."""
    return parse_ts(frozen) if frozen else None


def shorten(text: str, limit: int) -> str:
    """One line of at most `limit` characters, ending in '…' when cut."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: max(0, limit - 1)] + "…"


def hang(text: str, width: int, indent: int) -> str:
    """Wrap `text` to `width` columns with every line after the first indented by `indent` (a label column)."""
    lines = textwrap.wrap(" ".join(str(text).split()), width=max(10, width - indent)) or [""]
    return ("\n" + " " * indent).join(lines)


def compact(value: Any, limit: int = 60) -> str:
    """A short one-line rendering of a JSON value (params, args)."""
    if isinstance(value, dict):
        text = " ".join(f"{k}={compact(v, limit)}" for k, v in value.items())
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    return shorten(text, limit)


def tolerance(value: Any) -> str:
    """The goal's tolerance ({metric, value} or a bare number) as 'rel_rms ≤ 1e-05'."""
    if isinstance(value, Mapping):
        metric, bound = value.get("metric", "error"), value.get("value")
        text = f"{metric} ≤ {bound:g}" if isinstance(bound, (int, float)) else f"{metric} ≤ {bound}"
        per_output = value.get("per_output")
        if isinstance(per_output, Mapping) and per_output:
            text += " (" + ", ".join(f"{k} ≤ {v:g}" if isinstance(v, (int, float)) else f"{k} ≤ {v}"
                                     for k, v in per_output.items()) + ")"
        return text
    if isinstance(value, (int, float)):
        return f"≤ {value:g}"
    return DASH if value in (None, "") else str(value)


def baseline(value: Any) -> str:
    """The goal's baseline (a name or a table with one) as a name."""
    if isinstance(value, Mapping):
        return str(value.get("name") or value.get("baseline") or compact(value))
    return DASH if value in (None, "") else str(value)


BUDGET_PARTS = (("max_iterations", "{} attempts"), ("max_tool_calls", "{} tool calls"), ("max_hours", "{:g} h"),
                ("max_cost", "${:g}"))
"""The limits a budget line shows, in order, and how each reads."""


def budget(value: Mapping[str, Any]) -> str:
    """A run budget as '20 attempts · 200 tool calls · 1 h · $5'; 'unlimited' when nothing is set."""
    parts = [form.format(value[key]) for key, form in BUDGET_PARTS if value.get(key) is not None]
    return " · ".join(parts) if parts else "unlimited"


def shape(value: Any) -> str:
    """A goal shape ({name, params}) as 'S1 4096×4096' when its params are all sizes, else 'S1 rows=7 dtype=bf16'."""
    if isinstance(value, Mapping):
        params = value.get("params")
        name = str(value.get("name", "?"))
        if not isinstance(params, Mapping) or not params:
            return name
        if all(isinstance(v, int) and not isinstance(v, bool) for v in params.values()):
            return f"{name} " + "×".join(str(v) for v in params.values())
        return f"{name} {compact(params, 48)}"
    return str(value)


def ledger_entry(entry: Any) -> tuple[str, str]:
    """A strategy-ledger entry as (status, text).

    The ledger's entry layout belongs to the agent's memory module, so this reads the common field names
    and falls back to the whole entry rather than dropping anything.
    """
    if not isinstance(entry, Mapping):
        return "", shorten(str(entry), 200)
    status = str(entry.get("status") or entry.get("outcome") or entry.get("verdict") or "")
    title = entry.get("strategy") or entry.get("idea") or entry.get("name") or entry.get("text") or entry.get("summary")
    text = str(title) if title else compact({k: v for k, v in entry.items() if k not in ("status", "outcome")}, 200)
    extras = []
    if isinstance(entry.get("attempts"), list) and entry["attempts"]:
        extras.append("#" + ",".join(str(a) for a in entry["attempts"][-4:]))
    elif entry.get("attempt") is not None:
        extras.append(f"#{entry['attempt']}")
    if isinstance(entry.get("speedup"), (int, float)):
        extras.append(speedup(entry["speedup"]))
    if entry.get("reason") or entry.get("why"):
        extras.append(str(entry.get("reason") or entry.get("why")))
    return status, shorten(" ".join([text, *extras]), 200)


def memory_summary(memory: Mapping[str, Any]) -> str:
    """The compacted memory's summary text (or its keys when it has no summary field)."""
    for key in ("summary", "text", "notes"):
        if isinstance(memory.get(key), str) and memory[key].strip():
            return memory[key].strip()
    return compact({k: v for k, v in memory.items() if k not in ("ledger",)}, 300)


def _args(args: Mapping[str, Any]) -> str:
    shown = {k: v for k, v in args.items() if k not in ("source_sha256",)}
    if "source_chars" in shown:
        shown["source"] = f"<{shown.pop('source_chars')} chars>"
    return compact(shown, 120)


def _result_line(n: Any, result: Mapping[str, Any]) -> str:
    verdict = result.get("verdict", "?")
    parts = [f"attempt {n}: {verdict}"]
    if result.get("speedup") is not None:
        parts.append(speedup(result["speedup"]))
    times = [s.get("ms") for s in result.get("shapes", []) if isinstance(s, Mapping) and s.get("ms") is not None]
    if times:
        parts.append(f"{ms(sum(times))} ms")
    if result.get("timing_comparable") is False and verdict == "ok":
        parts.append("(timing not comparable)")
    line = " ".join(parts)
    if verdict != "ok" and result.get("message"):
        line += f" — {result['message']}"
    return line


Summary = Callable[[Any], str]

SUMMARIES: dict[str, Summary] = {}
"""One line per event type, from its typed data (workbench.journal.events); older journals may lack keys."""


_says = ev.by_type(SUMMARIES)


@_says("session.created")
def _session_created(data: ev.SessionCreated) -> str:
    model = f" ({data['model']})" if data.get("model") else ""
    return f"session {data.get('id', '?')} · {data.get('task', '?')} · {data.get('agent', '?')}{model} · " \
           f"{data.get('device', '?')}"


@_says("goal.set")
def _goal_set(data: ev.GoalSet) -> str:
    shapes = data.get("shapes") or []
    return f"{data.get('task', '?')}: {len(shapes)} shapes · {tolerance(data.get('tolerance'))} · " \
           f"vs {baseline(data.get('baseline'))}"


@_says("run.started")
def _run_started(data: ev.RunStarted) -> str:
    how = "resumed" if data.get("resumed") else "started"
    slots = data.get("slots")
    fleet = f" · {len(slots)} slot{'s' if len(slots) != 1 else ''}" if slots else ""
    fleet += f" on {data['cluster']}" if slots and data.get("cluster") == "ray" else ""
    branches = f" · {data['branches']} branches" if data.get("branches", 1) > 1 else ""
    return f"run {how} · {data.get('agent', '?')}{fleet}{branches} · budget {budget(data.get('budget') or {})}"


@_says("run.stopped")
def _run_stopped(data: ev.RunStopped) -> str:
    return f"{'finished' if data.get('final') else 'stopped'}: {data.get('reason', '')}"


@_says("tool.call")
def _tool_call(data: ev.ToolCalled) -> str:
    return f"{data.get('call_id', '')} {data.get('tool', '?')} {_args(data.get('args') or {})}".rstrip()


@_says("tool.result")
def _tool_result(data: ev.ToolResult) -> str:
    # A tool's summary is its one-line rendering (workbench.agent.tools.base.ToolOutcome).
    head = f"{data.get('call_id', '')} {data.get('tool', '?')}"
    if data.get("aborted"):
        return f"{head} ABORTED: {data.get('error', '')}"
    if not data.get("ok"):
        return f"{head} FAILED: {data.get('error', '')}"
    return f"{head} ok: {data.get('summary', '')}"


@_says("attempt.written")
def _attempt_written(data: ev.AttemptWritten) -> str:
    parent = f" ← {data['parent']}" if data.get("parent") is not None else ""
    params = f" [{compact(data['params'], 80)}]" if data.get("params") else ""
    note = f": {data['note']}" if data.get("note") else ""
    who = "the starting kernel" if data.get("author") == "start" else f"by {data.get('author', 'agent')}"
    return f"attempt {data.get('attempt', '?')}{parent} {who}{note}{params}"


@_says("eval.finished")
def _eval_finished(data: ev.EvalFinished) -> str:
    line = _result_line(data.get("attempt", "?"), data.get("result") or {})
    if data.get("check") == "heldout" and "job" in data:
        passed = (data.get("heldout") or {}).get("passed")
        line = f"held-out check {'passed' if passed else 'FAILED'} · " + line
    if "slot" in data:
        line += f" · on {data['slot'].get('slot', '?')}"
    if data.get("pending"):
        line += " · best once confirmed"
    return line


def _job(data: Mapping[str, Any]) -> str:
    """An evaluation job as the log names it: its id and its attempt ("j00039 attempt 32")."""
    return f"{data.get('job', '?')} attempt {data.get('attempt', '?')}"


def _slot_name(data: Mapping[str, Any]) -> str:
    """The name of the slot an event's `slot` (workbench.fleet's SlotInfo as journaled) describes."""
    return (data.get("slot") or {}).get("slot", "?")


@_says("eval.queued")
def _eval_queued(data: ev.EvalQueued) -> str:
    what = "held-out check of" if data.get("kind") == "heldout" else "evaluation of"
    pinned = f" on {data['slot']}" if data.get("slot") else ""
    again = f" (again: {data['requeue_of']} was interrupted)" if data.get("requeue_of") else ""
    return f"{data.get('job', '?')} {what} attempt {data.get('attempt', '?')} queued{pinned}{again}"


@_says("eval.started")
def _eval_started(data: ev.EvalStarted) -> str:
    return f"{_job(data)} on {_slot_name(data)}"


@_says("eval.requeued")
def _eval_requeued(data: ev.EvalRequeued) -> str:
    return f"{_job(data)} left {_slot_name(data)} for another slot: {data.get('message', '')}"


@_says("eval.failed")
def _eval_failed(data: ev.EvalFailed) -> str:
    how = "cancelled" if data.get("cancelled") else "FAILED"
    return f"{_job(data)} {how}: {data.get('message', '')}"


@_says("fleet.slot")
def _fleet_slot(data: ev.FleetSlot) -> str:
    moved = f" · reference now {data['reference']}" if data.get("reference") else ""
    message = f": {data['message']}" if data.get("message") else ""
    return f"{_slot_name(data)} {data.get('state', '?')}{message}{moved}"


@_says("profile.finished")
def _profile_finished(data: ev.ProfileFinished) -> str:
    target = f"attempt {data['attempt']}: " if data.get("attempt") is not None else ""
    return target + (data.get("summary") or compact({k: v for k, v in data.items() if k != "attempt"}, 160))


@_says("nudge.received")
def _nudge_received(data: ev.NudgeReceived) -> str:
    sticky = " (persistent)" if data.get("persistent") else ""
    return f"{data.get('id', '?')}{sticky}: {data.get('text', '')}"


@_says("nudge.acked")
def _nudge_acked(data: ev.NudgeAcked) -> str:
    revoked = " revoked" if data.get("revoked") else ""
    note = f": {data['note']}" if data.get("note") else ""
    return f"{data.get('id', '?')} acknowledged{revoked}{note}"


@_says("ledger.updated")
def _ledger_updated(data: ev.LedgerUpdated) -> str:
    ledger = data.get("ledger") or []
    if not ledger:
        return "ledger emptied"
    status, text = ledger_entry(ledger[-1])
    return f"{len(ledger)} strategies · latest: {f'[{status}] ' if status else ''}{text}"


@_says("llm.response")
def _llm_response(data: ev.LlmResponse) -> str:
    if data.get("ok") is False:
        wait = f"; retry in {data['retry_in']:.1f} s" if isinstance(data.get("retry_in"), (int, float)) else ""
        return f"try {data.get('try', '?')} failed: {data.get('error', '')}{wait}"
    cost = f" · ${data['cost_usd']:.4f}" if isinstance(data.get("cost_usd"), (int, float)) else ""
    return f"{data.get('input_tokens', 0)} in / {data.get('output_tokens', 0)} out tokens{cost}"


@_says("run.paused")
def _run_paused(data: ev.RunPaused) -> str:
    return "paused"


@_says("run.resumed")
def _run_resumed(data: ev.RunResumed) -> str:
    return "resumed"


@_says("llm.request")
def _llm_request(data: ev.LlmRequest) -> str:
    return compact(data, 160) if data else "request"


@_says("memory.compacted")
def _memory_compacted(data: ev.MemoryCompacted) -> str:
    return shorten(memory_summary(data), 200)


@_says("checkpoint.written")
def _checkpoint_written(data: ev.CheckpointWritten) -> str:
    return f"checkpoint at seq {data.get('seq', '?')}"


@_says("error")
def _error(data: ev.ErrorRaised) -> str:
    return str(data.get("message", ""))


def event_summary(kind: str, data: Mapping[str, Any]) -> str:
    """What one event says, in one line (without time, seq and type)."""
    summary = SUMMARIES.get(kind)
    return summary(data) if summary is not None else compact(data, 200)


def event_line(event: Mapping[str, Any]) -> str:
    """One log line for a journal event: local time, seq, type, then what it says."""
    data = event.get("data") or {}
    kind = str(event.get("type", "?"))
    head = f"{clock(str(event.get('ts', '')))} {event.get('seq', 0):>5} {kind:<{TYPE_WIDTH}} "
    return head + shorten(event_summary(kind, data), LINE_LIMIT - len(head))


EVENT_FILTERS: tuple[tuple[str, str, frozenset[str] | None], ...] = (
    ("all", "all", None),
    ("attempts", "attempts + evals", frozenset({"attempt.written", "eval.queued", "eval.started", "eval.requeued",
                                                 "eval.finished", "eval.failed", "fleet.slot", "profile.finished",
                                                 "ledger.updated"})),
    ("tools", "tools", frozenset({"tool.call", "tool.result"})),
    ("nudges", "nudges + errors", frozenset({"nudge.received", "nudge.acked", "error", "run.paused",
                                               "run.resumed", "run.stopped"})),
)
"""(key, label, event types shown or None for all): the presets `f` cycles through in the event log and list."""


def next_filter(key: str) -> str:
    """The preset after `key` (wrapping), so one key steps through them all."""
    keys = [k for k, _label, _types in EVENT_FILTERS]
    return keys[(keys.index(key) + 1) % len(keys)] if key in keys else keys[0]


def filter_label(key: str) -> str:
    """The preset's name as the person reads it."""
    return next((label for k, label, _types in EVENT_FILTERS if k == key), key)


def filter_types(key: str) -> frozenset[str] | None:
    """The event types preset `key` shows; None for all."""
    return next((t for k, _label, t in EVENT_FILTERS if k == key), None)


def passes(key: str, event: Mapping[str, Any]) -> bool:
    """Whether preset `key` shows `event`."""
    types = filter_types(key)
    return types is None or event.get("type") in types


def tokens(count: int) -> str:
    """A token count as '950', '12.3k' or '4.56M'."""
    if count < 1000:
        return str(count)
    if count < 1_000_000:
        return f"{count / 1000:.1f}k"
    return f"{count / 1_000_000:.2f}M"
