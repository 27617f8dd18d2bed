"""The tools an agent calls, one object each (see tools.base), and how any journaled tool result reads to a model."""

from __future__ import annotations

from typing import Any, Mapping

from workbench.agent.tools.base import (
    Deferred,
    Tool,
    ToolContext,
    ToolError,
    ToolOutcome,
    ToolSpec,
    check_args,
    text,
)
from workbench.agent.tools.person import AskPerson, Finish, Ledger
from workbench.agent.tools.reading import (
    HELDOUT_DIR,
    DiffAttempts,
    ListAttempts,
    Profile,
    ReadFile,
    ReadKernel,
    ReadTask,
    ShowBest,
    confined_path,
)
from workbench.agent.tools.writing import EditKernel, Evaluate, WriteKernel, arrival_text, link_evidence
from workbench.journal.events import Block
from workbench.session.state import SessionState

TOOLS: dict[str, Tool] = {tool.name: tool for tool in (
    ReadTask(), ReadKernel(), ReadFile(), WriteKernel(), EditKernel(), Evaluate(), Profile(), ListAttempts(),
    ShowBest(), DiffAttempts(), Ledger(), AskPerson(), Finish(),
)}
"""Every tool by name, in the order a model is shown them."""


def specs(version: int | None = None) -> list[ToolSpec]:
    """The tools as a model API is shown them, in a fixed order (as of prompts `version`; None: the current)."""
    return [tool.spec(version) for tool in TOOLS.values()]


def render_result(call: Mapping[str, Any], result: Mapping[str, Any] | None, state: SessionState
                  ) -> tuple[list[Block], bool]:
    """The content of one tool result as the model reads it, from the journaled call and result and the state.

    Returns:
        (content blocks, is_error).
    """
    if result is None:
        return [text("interrupted: no result was recorded for this call")], True
    if not result.get("ok"):
        message = result.get("error", "failed")
        if result.get("aborted"):
            return [text(f"interrupted: {message}; check the state block and re-run the call if it is still needed")], True
        return [text(f"error: {message}")], True
    tool = TOOLS.get(call.get("tool", ""))
    summary = result.get("summary", "")
    if tool is None:
        return [text(summary or "ok")], False
    return tool.render(result.get("data") or {}, summary, state), False


__all__ = ["HELDOUT_DIR", "TOOLS", "Deferred", "Tool", "arrival_text", "link_evidence", "ToolContext", "ToolError", "ToolOutcome", "ToolSpec", "check_args",
           "confined_path", "render_result", "specs"]
