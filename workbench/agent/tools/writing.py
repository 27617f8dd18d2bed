"""Tools that make attempts: write a whole kernel, edit one, evaluate one (from the journal when already evaluated)."""

from __future__ import annotations

from typing import Any, Mapping

from workbench.agent import ledger as ledger_mod
from workbench.agent.prompts import best_line, report_lines
from workbench.agent.tools.base import Tool, ToolContext, ToolError, ToolOutcome, arguments, prop, text
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
    )

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        force = bool(args.get("force"))
        if "source" in args:
            n = self._attempt_of_source(ctx, args)
        else:
            n = args.get("attempt") or (ctx.state.current.n if ctx.state.current else None)
            if n is None:
                raise ToolError("evaluate: nothing to evaluate yet; write_kernel or edit_kernel first")
            ctx.attempt(n, self.name)
        attempt = ctx.state.attempts[n]
        warnings = ledger_mod.find_repeats(ctx.state, attempt)
        if warnings and not force:
            raise ToolError(f"evaluate: attempt {n} not evaluated: " + " / ".join(w["message"] for w in warnings)
                            + ". If this try differs for a reason the ledger does not show, pass force=true.")
        evaluated = ctx.evaluate(n, force=force)
        result = evaluated.result
        speed = f" {result['speedup']:.3g}x" if result.get("speedup") is not None else ""
        summary = f"attempt {n}: {result['verdict']}{speed}"
        data: dict[str, Any] = {"attempt": n, "verdict": result["verdict"], "report": agent_report(result)}
        if evaluated.cached_seq is not None:
            summary += (f" (from the journal: this source was evaluated before, at seq {evaluated.cached_seq}; "
                        "nothing was run; force=true runs it again)")
            data["cached"] = evaluated.cached_seq
        else:
            self._link_evidence(ctx, n)
        if warnings:
            data["forced_past"] = [w["strategy"] for w in warnings]
        return ToolOutcome(summary, data)

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

    @staticmethod
    def _link_evidence(ctx: ToolContext, n: int) -> None:
        sid = ctx.state.attempts[n].params.get("strategy")
        if sid:
            linked = ledger_mod.link(ctx.state.ledger, sid, ctx.state.attempts[n])
            if linked is not None:
                ctx.emit("ledger.updated", {"ledger": linked, "change": {"action": "evidence", "id": sid, "attempt": n}})

    def render(self, data: Mapping[str, Any], summary: str, state: SessionState) -> list[Block]:
        return [text("\n".join([summary, *report_lines(data.get("report") or {}), best_line(state)]))]
