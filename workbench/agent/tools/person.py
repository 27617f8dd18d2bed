"""Tools about the work itself: the strategy ledger, a question to the person, and finishing."""

from __future__ import annotations

from typing import Any, Mapping

from workbench.agent import ledger as ledger_mod
from workbench.agent.tools.base import Tool, ToolContext, ToolError, ToolOutcome, arguments, prop, text
from workbench.journal.events import Block
from workbench.session.state import SessionState


class Ledger(Tool):
    name = "ledger"
    description = ("Add a strategy to the ledger or update one (status, expected vs actual effect, why, evidence "
                   "attempts). Record every idea before trying it; mark failures with why.")
    parameters = arguments(
        ("action",),
        action=prop("string", "add or update.", enum=["add", "update"]),
        id=prop("string", "Strategy id, for update (e.g. 'S2')."),
        strategy=prop("string", "One line: what the strategy changes."),
        status=prop("string", "Its status.", enum=list(ledger_mod.STATUSES)),
        expected=prop("string", "Expected effect."),
        actual=prop("string", "Measured effect."),
        why=prop("string", "Why it failed, partly worked or was dropped."),
        attempts=prop("array", "Attempt numbers that are its evidence.", items={"type": "integer", "minimum": 1}),
    )

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        fields = {k: v for k, v in args.items() if k not in ("action", "id")}
        try:
            if args["action"] == "add":
                new, entry = ledger_mod.add(ctx.state.ledger, fields, ctx.state)
            else:
                if not args.get("id"):
                    raise ToolError("ledger: update needs the strategy id")
                new, entry = ledger_mod.update(ctx.state.ledger, args["id"], fields, ctx.state)
        except ledger_mod.LedgerError as exc:
            raise ToolError(f"ledger: {exc}") from None
        ctx.emit("ledger.updated", {"ledger": new, "change": {"action": args["action"], "id": entry["id"]}})
        verb = "added" if args["action"] == "add" else "updated"
        return ToolOutcome(f"{entry['id']} {verb} [{entry['status']}]", {"entry": entry})

    def render(self, data: Mapping[str, Any], summary: str, state: SessionState) -> list[Block]:
        entry = data.get("entry")
        return [text(f"{summary}\n{ledger_mod.line(entry)}" if entry else summary)]


class AskPerson(Tool):
    name = "ask_person"
    description = "Ask the person watching a question without waiting; the answer arrives later as a message."
    parameters = arguments(("question",), question=prop("string", "The question."))

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        question = args["question"].strip()
        if not question:
            raise ToolError("ask_person: the question is empty")
        if ctx.ask(question):
            return ToolOutcome("question sent; the answer will arrive as a message from the person in a later turn "
                               "(keep working meanwhile)", {"question": question, "sent": True})
        return ToolOutcome("nobody can answer now (no one is watching this run); decide yourself and record why in "
                           "the ledger", {"question": question, "sent": False})


class Finish(Tool):
    name = "finish"
    description = "End the session: the kernel is as good as you can make it."
    parameters = arguments(("reason",), reason=prop("string", "One line: why you stop."))

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        return ToolOutcome(f"finish recorded: {args['reason']}. (If you read this, the person resumed the run: keep "
                           "improving the kernel.)", {"reason": args["reason"]})
