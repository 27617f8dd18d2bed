"""Tools that make attempts: write a whole kernel, edit one, evaluate one (from the journal when already evaluated)."""

from __future__ import annotations

from typing import Any, Mapping

from workbench.agent import ledger as ledger_mod
from workbench.agent.prompts import best_line, report_lines
from workbench.agent.evaluation import journaled_result
from workbench.agent.tools.base import Deferred, Tool, ToolContext, ToolError, ToolOutcome, arguments, prop, text
from workbench.evaluator.result import agent_report
from workbench.journal.events import Block
from workbench.session.revisions import changed, sha256_text
from workbench.session.state import SessionState

NOTE = prop("string", "One line: what this version changes and why.")
STRATEGY = prop("string", "Ledger id of the strategy this change belongs to (e.g. 'S3').")


def strategy_tag(ctx: ToolContext, args: Mapping[str, Any], tool: str) -> dict[str, Any]:
    """{'strategy': id} for a ledger id the call names, or {}; an unknown id is an error."""
    sid = args.get("strategy")
    if not sid:
        return {}
    entry = ledger_mod.find(ctx.state.ledger, sid)
    if entry is None:
        known = ", ".join(e["id"] for e in ctx.state.ledger) or "none yet"
        raise ToolError(f"{tool}: no strategy {sid!r} in the ledger (ids: {known}); add it with the ledger tool first")
    return {"strategy": entry["id"]}


class _NewAttempt(Tool):
    """A tool that writes a new attempt (not evaluated yet)."""

    def new_attempt(self, ctx: ToolContext, source: str, *, parent: int | None, note: str,
                    params: dict[str, Any]) -> ToolOutcome:
        sha = sha256_text(source)
        for other in ctx.state.attempts.values():
            if other.sha256 == sha:
                raise ToolError(f"{self.name}: identical to attempt {other.n} ({other.verdict or 'not evaluated'}); "
                                "evaluate that one or change something")
        n = ctx.write_attempt(source, note=note, params=params, parent=parent)
        attempt = ctx.state.attempts[n]
        warnings = ledger_mod.find_repeats(ctx.state, attempt)
        parent_text = f"parent #{parent}" if parent is not None else "from the seed"
        base = ctx.state.attempts[parent].source if parent is not None else ctx.seed_source
        count = sum(changed(base, source))
        summary = f"attempt {n} written ({parent_text}, {count} lines changed); evaluate it to measure"
        return ToolOutcome(summary, {"attempt": n, "parent": parent, "warnings": warnings})

    def render(self, data: Mapping[str, Any], summary: str, state: SessionState) -> list[Block]:
        lines = [summary, *(f"WARNING: {w['message']}" for w in data.get("warnings", []))]
        return [text("\n".join(lines))]


class WriteKernel(_NewAttempt):
    name = "write_kernel"
    description = "Write a whole kernel file as a new attempt (not evaluated yet). Parent defaults to the latest attempt."
    parameters = arguments(("source",), source=prop("string", "The complete Python file."), note=NOTE,
                           strategy=STRATEGY, parent=prop("integer", "The attempt this one derives from.", minimum=1))

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        params = strategy_tag(ctx, args, self.name)
        parent = args.get("parent", ctx.state.current.n if ctx.state.current else None)
        if parent is not None:
            ctx.attempt(parent, self.name)
        if not args["source"].strip():
            raise ToolError("write_kernel: source is empty")
        return self.new_attempt(ctx, args["source"], parent=parent, note=args.get("note", ""), params=params)


class EditKernel(_NewAttempt):
    name = "edit_kernel"
    description = ("Exact search/replace on an attempt's source (default: the latest) giving a new attempt. The search "
                   "text must occur exactly once, whitespace included.")
    parameters = arguments(("search", "replace"), search=prop("string", "Exact text to replace (occurs once)."),
                           replace=prop("string", "Replacement text."), note=NOTE, strategy=STRATEGY,
                           attempt=prop("integer", "The attempt to edit (default: the latest).", minimum=1))

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        params = strategy_tag(ctx, args, self.name)
        base_n = args.get("attempt") or (ctx.state.current.n if ctx.state.current else None)
        source = ctx.attempt(base_n, self.name).source if base_n is not None else ctx.seed_source
        where = f"attempt {base_n}" if base_n is not None else "the seed"
        search = args["search"]
        if not search:
            raise ToolError("edit_kernel: search is empty")
        count = source.count(search)
        if count == 0:
            raise ToolError(f"edit_kernel: search text not found in {where} (it must match exactly, whitespace "
                            "included; read_kernel shows the source)")
        if count > 1:
            raise ToolError(f"edit_kernel: search text occurs {count} times in {where}; include more surrounding "
                            "lines so it matches exactly once")
        new = source.replace(search, args["replace"], 1)
        if new == source:
            raise ToolError("edit_kernel: the replacement changes nothing")
        return self.new_attempt(ctx, new, parent=base_n, note=args.get("note", ""), params=params)


WAITS = ("first", "all", "none")
"""How long an evaluate call waits: for its first result, for all of them, or not at all."""


class Evaluate(Tool):
    name = "evaluate"
    description = ("Evaluate an attempt (default: the latest) in a fresh process: correctness on every shape, then "
                   "timing against the baseline. Refuses a change that repeats a failed strategy unless force=true.")
    parameters = arguments(
        attempt=prop("integer", "Attempt number (default: the latest).", minimum=1),
        force=prop("boolean", "Evaluate even though the change repeats a failed strategy."),
        source=prop("string", "Write this file as a new attempt and evaluate it in one step."),
        note=NOTE,
        strategy=STRATEGY,
        params=prop("object", "Tunable values this version sets (for the record)."),
        parent=prop("integer", "With source: the attempt it derives from.", minimum=1),
        attempts=prop("array", "Several attempts to evaluate at once (they run in parallel on the evaluation "
                      "slots); instead of attempt.", items={"type": "integer", "minimum": 1}),
        wait=prop("string", "first (default): return when the first result is in; the others arrive as messages "
                  "in later turns as each finishes. all: return when every result is in. none: return at once; "
                  "every result arrives as a message.", enum=list(WAITS)),
    )
    added = {"attempts": 2, "wait": 2}

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome | Deferred:
        force = bool(args.get("force"))
        numbers = self._numbers(ctx, args)
        for n in numbers:
            warnings = ledger_mod.find_repeats(ctx.state, ctx.state.attempts[n])
            if warnings and not force:
                raise ToolError(f"evaluate: attempt {n} not evaluated: " + " / ".join(w["message"] for w in warnings)
                                + ". If this try differs for a reason the ledger does not show, pass force=true.")
        wait = args.get("wait", "first")
        cached = {n: ev.cached_seq for n in numbers if (ev := ctx.evaluate(n, force=force)) is not None}
        forced = {w["strategy"] for n in numbers for w in ledger_mod.find_repeats(ctx.state, ctx.state.attempts[n])}

        def ready() -> bool:
            done = [n for n in numbers if n in cached or ctx.final(n)]
            return bool(done) if wait == "first" else len(done) == len(numbers)

        def finish() -> ToolOutcome:
            return self._outcome(ctx, numbers, cached, sorted(forced))

        if wait == "none" or ready():
            return finish()
        return Deferred(ready, finish)

    def _numbers(self, ctx: ToolContext, args: dict[str, Any]) -> list[int]:
        """The attempts a call names: attempts=[...], a source (an earlier attempt with that text, else a new
        one), attempt=n, or the latest."""
        given = [k for k in ("attempts", "source", "attempt") if k in args]
        if len(given) > 1:
            raise ToolError(f"evaluate: pass one of attempts, source or attempt, not {' and '.join(given)}")
        if "source" in args:
            return [self._attempt_of_source(ctx, args)]
        if "attempts" in args:
            numbers = list(dict.fromkeys(args["attempts"]))
            if not numbers:
                raise ToolError("evaluate: attempts is empty")
        else:
            latest = args.get("attempt") or (ctx.state.current.n if ctx.state.current else None)
            if latest is None:
                raise ToolError("evaluate: nothing to evaluate yet; write_kernel or edit_kernel first")
            numbers = [latest]
        for n in numbers:
            ctx.attempt(n, self.name)
        return numbers

    def _outcome(self, ctx: ToolContext, numbers: list[int], cached: dict[int, int | None],
                 forced: list[str]) -> ToolOutcome:
        """The call's result: each standing result (in order), then what is still running."""
        reports = []
        for n in numbers:
            if n in cached or ctx.final(n):
                reports.append(self._report(ctx.state, n, cached.get(n)))
        queued = [n for n in numbers if n not in cached and not ctx.final(n)]
        if len(numbers) == 1 and reports:
            data = reports[0]
            summary = data.pop("summary")
        else:
            for report in reports:
                report.pop("summary")
            data = {"reports": reports}
            done = ", ".join(f"attempt {r['attempt']}: {r['verdict']}" for r in reports)
            running = f"attempt{'s' if len(queued) > 1 else ''} {', '.join(map(str, queued))} queued" if queued else ""
            summary = "; ".join(p for p in (done, running) if p)
        if queued:
            data["queued"] = queued
        if forced:
            data["forced_past"] = forced
        return ToolOutcome(summary, data)

    @staticmethod
    def _report(state: SessionState, n: int, cached_seq: int | None) -> dict[str, Any]:
        attempt = state.attempts[n]
        if attempt.verdict is None or attempt.eval_error and attempt.eval_seq is None:
            return {"summary": f"attempt {n}: not evaluated: {attempt.eval_error}", "attempt": n,
                    "verdict": "error", "error": attempt.eval_error}
        result = journaled_result(attempt)
        speed = f" {result['speedup']:.3g}x" if result.get("speedup") is not None else ""
        summary = f"attempt {n}: {result['verdict']}{speed}"
        data: dict[str, Any] = {"summary": summary, "attempt": n, "verdict": result["verdict"],
                                "report": agent_report(result)}
        if cached_seq is not None:
            data["summary"] += (f" (from the journal: this source was evaluated before, at seq {cached_seq}; "
                                "nothing was run; force=true runs it again)")
            data["cached"] = cached_seq
        return data

    def _attempt_of_source(self, ctx: ToolContext, args: dict[str, Any]) -> int:
        """The attempt a `source` argument names: an earlier attempt with that very text, else a new one."""
        same = next((a for a in ctx.state.attempts.values() if a.sha256 == sha256_text(args["source"])), None)
        if same is not None:
            return same.n
        parent = args.get("parent", ctx.state.best)
        if parent is not None and parent not in ctx.state.attempts:
            raise ToolError(f"evaluate: parent attempt {parent} does not exist")
        params = {**(args.get("params") or {}), **strategy_tag(ctx, args, self.name)}
        return ctx.write_attempt(args["source"], note=args.get("note", ""), params=params, parent=parent)

    def render(self, data: Mapping[str, Any], summary: str, state: SessionState) -> list[Block]:
        if "reports" not in data:
            if "report" not in data:  # queued (wait=none), or the evaluation failed
                lines = [summary]
            else:
                lines = [summary, *report_lines(data.get("report") or {})]
        else:
            lines = []
            for report in data["reports"]:
                lines.append(f"attempt {report['attempt']}: {report['verdict']}")
                lines.extend(report_lines(report["report"]) if "report" in report else [report.get("error", "")])
        if data.get("queued"):
            lines.append(f"still running: attempt{'s' if len(data['queued']) > 1 else ''} "
                         f"{', '.join(map(str, data['queued']))}; each result arrives as a message when it finishes")
        return [text("\n".join([*lines, best_line(state)]))]


def arrival_text(state: SessionState, n: int) -> str:
    """An evaluation result that arrived after the evaluate call that queued it had returned, as the model reads it
    in the next request."""
    attempt = state.attempts[n]
    if attempt.verdict is None or attempt.eval_error and attempt.eval_seq is None:
        return f"Evaluation of attempt {n} finished without a result: {attempt.eval_error or 'no result'}"
    lines = [f"Evaluation of attempt {n} finished (queued by an earlier evaluate call):",
             *report_lines(agent_report(journaled_result(attempt))), best_line(state)]
    return "\n".join(lines)


def link_evidence(state: SessionState, n: int, emit: Any) -> None:
    """Add attempt n's standing result to the evidence of the ledger strategy it is tagged with (if any)."""
    sid = state.attempts[n].params.get("strategy")
    if sid:
        linked = ledger_mod.link(state.ledger, sid, state.attempts[n])
        if linked is not None:
            emit("ledger.updated", {"ledger": linked, "change": {"action": "evidence", "id": sid, "attempt": n}})
