"""The Markdown report of one session (`e` in review, `workbench review ID --export`); no Textual here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from workbench.session.atomic import write_text_atomic
from workbench.session.state import Attempt, SessionState
from workbench.ui import formatting as fmt
from workbench.session.revisions import counts, unified
from workbench.ui.history import SessionHistory

REPORT_NAME = "report.md"
"""Written into the session folder, beside session.toml and events.jsonl."""

BLOCKS = " ▁▂▃▄▅▆▇█"
"""Eighth-blocks for the text sparkline: readable in any Markdown viewer and in a terminal."""

SPARK_WIDTH = 60
"""Columns of the report's speedup sparkline; longer sessions are bucketed (best speedup per bucket)."""


def _cell(value: Any) -> str:
    """A Markdown table cell: one line, pipes escaped."""
    return " ".join(str(value).split()).replace("|", "\\|")


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def spark(values: Sequence[float | None], width: int = SPARK_WIDTH) -> str:
    """A one-line block sparkline; None (a failed attempt) draws as a blank, so failures show as gaps.

    Args:
        values: one value per attempt, in order.
        width: at most this many characters; more values are bucketed, keeping each bucket's maximum.
    """
    if not values:
        return ""
    buckets: list[float | None] = []
    count = min(width, len(values))
    for i in range(count):
        chunk = [v for v in values[i * len(values) // count:(i + 1) * len(values) // count] if v is not None]
        buckets.append(max(chunk) if chunk else None)
    finite = [v for v in buckets if v is not None]
    if not finite:
        return " " * count
    low, high = min(finite), max(finite)
    span = high - low or 1.0
    return "".join(" " if v is None else BLOCKS[1 + round((v - low) / span * (len(BLOCKS) - 2))] for v in buckets)


def _strategy(attempt: Attempt, ledger: list[dict[str, Any]], *, long: bool) -> str:
    """The ledger strategy an attempt was written for, as 'S3' or 'S3 (text)', else ''."""
    sid = attempt.params.get("strategy") if isinstance(attempt.params, dict) else None
    if not sid:
        return ""
    entry = next((e for e in ledger if isinstance(e, dict) and e.get("id") == sid), None)
    return f"{sid} ({fmt.shorten(entry.get('strategy', ''), 50)})" if entry and long else str(sid)


def attempt_label(attempt: Attempt, ledger: list[dict[str, Any]], *, long: bool = True) -> str:
    """What an attempt tried: its strategy tag and its note.

    Args:
        attempt: the attempt.
        ledger: the ledger that names its strategy.
        long: spell the strategy out (the report); the narrow review timeline shows only its id.
    """
    parts = [_strategy(attempt, ledger, long=long), attempt.note]
    params = {k: v for k, v in attempt.params.items() if k != "strategy"} if isinstance(attempt.params, dict) else {}
    if params and not attempt.note:
        parts.append(fmt.compact(params, 60))
    return " · ".join(p for p in parts if p)


def render_report(history: SessionHistory) -> str:
    """The report as Markdown text: facts, goal, best result, attempt timeline, ledger, memory, best kernel."""
    state = history.state
    best = state.best_attempt
    attempts = [state.attempts[n] for n in history.order]
    lines = [f"# Session {history.id}", ""]
    lines += _table(("", ""), _facts(state))
    lines += ["", "## Goal", ""]
    goal = state.goal
    if goal:
        if goal.get("description"):
            lines += [_cell(goal["description"]), ""]
        shapes = goal.get("shapes") or []
        if isinstance(shapes, dict):
            shapes = shapes.get("cpu" if state.device == "cpu" else "cuda") or []
        lines += [f"- tolerance: {fmt.tolerance(goal.get('tolerance'))}",
                  f"- baseline: {fmt.baseline(goal.get('baseline'))}",
                  f"- metric: {goal.get('metric') or fmt.DASH}",
                  f"- shapes: {', '.join(fmt.shape(s) for s in shapes) or fmt.DASH}"]
    else:
        lines.append("No goal was journaled.")

    lines += ["", "## Result", ""]
    if best is None:
        lines.append("No attempt evaluated correct.")
    else:
        comparable = "" if best.timing_comparable else " (timing not comparable: CPU interpreter)"
        lines += [f"Best: attempt {best.n}, {fmt.speedup(best.speedup)} geomean speedup, {fmt.ms(best.ms)} ms "
                  f"over all shapes{comparable}.", ""]
        lines += _table(("shape", "correct", "rel err", "ms", "baseline ms", "speedup", "floor ms"),
                        ((s.get("name", "?"), "yes" if s.get("correct") else "no", fmt.rel_err(s.get("rel_err")),
                          fmt.ms(s.get("ms")), fmt.ms(s.get("baseline_ms")), fmt.speedup(s.get("speedup")),
                          fmt.ms(s.get("floor_ms"))) for s in best.shapes))
    speedups = [a.speedup if a.verdict == "ok" else None for a in attempts if a.verdict is not None]
    if speedups:
        finite = [v for v in speedups if v is not None]
        lines += ["", "Speedup over evaluated attempts (blank = not correct):", "", "```",
                  spark(speedups) + (f"   {min(finite):.2f}× … {max(finite):.2f}×" if finite else ""), "```"]

    lines += ["", f"## Attempts ({len(attempts)})", ""]
    lines += _table(("#", "parent", "author", "verdict", "ms", "speedup", "what it tried"),
                    ((f"{a.n}{' ★' if a.n == state.best else ''}", a.parent if a.parent is not None else fmt.DASH,
                      a.author, a.verdict or "not evaluated", fmt.ms(a.ms), fmt.speedup(a.speedup),
                      attempt_label(a, state.ledger) + (f" — {a.message}" if a.verdict not in (None, "ok") and
                                                        a.message else "")) for a in attempts))

    lines += ["", "## Strategy ledger", ""]
    if state.ledger:
        lines += _table(("id", "status", "strategy", "attempts", "why / actual"),
                        ((e.get("id", ""), e.get("status", ""), e.get("strategy", ""),
                          ", ".join(str(n) for n in e.get("attempts", []) or []),
                          e.get("why") or e.get("actual") or e.get("reason") or "")
                         if isinstance(e, dict) else ("", "", e, "", "") for e in state.ledger))
    else:
        lines.append("The ledger is empty.")
    if state.memory:
        lines += ["", "## Memory (latest compaction)", "", fmt.memory_summary(state.memory)]
    if state.nudges:
        lines += ["", "## Nudges", ""]
        lines += [f"- seq {n['seq']}{' (persistent)' if n['persistent'] else ''}"
                  f"{'' if n['acked'] else ' (not yet acknowledged)'}: {_cell(n['text'])}" for n in state.nudges]
    if state.errors:
        lines += ["", f"## Errors ({len(state.errors)})", ""]
        lines += [f"- {_cell(e)}" for e in state.errors[-20:]]
    if best is not None:
        lines += ["", f"## Best kernel (attempt {best.n})", "", "```python", best.source.rstrip("\n"), "```"]
        first = attempts[0] if attempts else None
        if first is not None and first.n != best.n:
            diff = unified(first.source, best.source, f"attempt {first.n}", f"attempt {best.n}")
            added, removed = counts(diff)
            lines += ["", f"Changes from attempt {first.n} to the best: +{added} −{removed} lines.", "",
                      "```diff", diff.rstrip("\n"), "```"]
    return "\n".join(lines) + "\n"


def _facts(state: SessionState) -> list[tuple[str, str]]:
    best = state.best_attempt
    rows = [
        ("task", state.task or fmt.DASH),
        ("agent", state.agent + (f" ({state.model})" if state.model else "")),
        ("device", state.device or fmt.DASH),
        ("status", state.status + (f" ({state.stop_reason})" if state.stop_reason else "")),
        ("created", state.created or fmt.DASH),
        ("running time", fmt.duration(state.elapsed_at())),
        ("attempts", f"{len(state.attempts)} written, {state.evaluated} evaluated"),
        ("best", f"attempt {best.n}: {fmt.speedup(best.speedup)}, {fmt.ms(best.ms)} ms" if best else fmt.DASH),
        ("tool calls", str(state.tool_calls)),
        ("events", str(state.events)),
        ("tokens", f"{state.tokens_in:,} in, {state.tokens_out:,} out"),
        ("cost", f"${state.cost_usd:.2f}"),
    ]
    return [("**" + k + "**", v) for k, v in rows]


def write_report(history: SessionHistory, path: Path | None = None) -> Path:
    """Render and write the report atomically (a reader never sees half a file); returns where it went.

    Args:
        history: the session.
        path: defaults to report.md in the session folder.
    """
    target = Path(path) if path is not None else history.folder / REPORT_NAME
    write_text_atomic(target, render_report(history))
    return target
