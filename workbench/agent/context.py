"""The prompt of an LLM turn, assembled from the journal-derived memory and state, in a vendor-neutral form.

The same function builds the prompt the conversation step sends (through its transport) and the one `workbench
show ID --prompt-at SEQ` prints, so what a person inspects is what the model saw (up to the prompt wording of this
version of the code, which each llm.request records as a hash).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from workbench.agent.memory import SessionMemory
from workbench.agent.prompts import system_prompt
from workbench.agent.tools import ToolSpec, specs
from workbench.journal.events import Block, Message
from workbench.session.state import SessionState, apply

if TYPE_CHECKING:
    from workbench.journal import Event


@dataclass(frozen=True)
class Prompt:
    """One request's content: the pinned system text, the tools, and the conversation (sources filled in)."""

    system: str
    tools: list[ToolSpec]
    messages: list[Message]
    """Roles alternate, user first; blocks are neutral (text, tool_use, tool_result)."""
    summary: bool
    """messages[0] starts with the compaction summary, which only changes at a compaction: transports with a
    prompt cache put a breakpoint after it."""


def expand(content: list[Block], state: SessionState) -> list[Block]:
    """Content blocks as a model reads them: source references filled in, our own bookkeeping keys removed."""
    out: list[Block] = []
    for block in content:
        if "source_of" in block:
            attempt = state.attempts.get(block["source_of"])  # type: ignore[typeddict-item]
            out.append({"type": "text", "text": attempt.source if attempt else
                        f"(attempt {block['source_of']} is not in the journal)"})  # type: ignore[typeddict-item]
        elif block.get("type") == "tool_use":
            out.append({k: block[k] for k in ("type", "id", "name", "input")})  # type: ignore[literal-required, misc]
        elif block.get("type") == "tool_result":
            result = {k: v for k, v in block.items() if k in ("type", "tool_use_id", "is_error")}
            result["content"] = expand(block.get("content", []), state)  # type: ignore[typeddict-item, arg-type]
            out.append(result)  # type: ignore[arg-type]
        else:
            out.append(dict(block))  # type: ignore[arg-type]
    return out


def build_prompt(memory: SessionMemory, state: SessionState, version: int | None = None) -> Prompt:
    """The prompt: system text, tools (as of prompts `version`; None: the current ones), then the compaction summary
    (if any) and the window, roles alternating."""
    messages: list[Message] = []
    if memory.summary:
        messages.append({"role": "user", "content": [{"type": "text", "text": memory.summary}]})
    for entry in memory.entries:
        content = expand(entry.content, state)
        if messages and messages[-1]["role"] == entry.role:
            messages[-1] = {"role": entry.role, "content": messages[-1]["content"] + content}  # type: ignore[typeddict-item]
        else:
            messages.append({"role": entry.role, "content": content})  # type: ignore[typeddict-item]
    return Prompt(system_prompt(state.goal), specs(version), messages, bool(memory.summary))


def context_at(events: Iterable["Event"], seq: int, branch: int | None = None
               ) -> tuple[Prompt | None, SessionMemory, dict[str, Any]]:
    """The context a model saw at the last llm.request at or before `seq`.

    Args:
        events: the journal's events from seq 1, in order.
        seq: a journal seq.
        branch: whose conversation (run --branches); None: the branch of that last request.

    Returns:
        (prompt or None when no model request happened by then, the memory at that point, and the llm.request
        data or, for a session without model requests, {}).
    """
    records = [e.to_dict() for e in events if e.seq <= seq]
    requests = [r for r in records if r["type"] == "llm.request"
                and (branch is None or r["data"].get("branch", 0) == branch)]
    state = SessionState()
    if not requests:
        memory = SessionMemory("tools")
        for record in records:
            apply(state, record)
            memory.apply(record)
        return None, memory, {}
    request = requests[-1]
    memory = SessionMemory("messages", request["data"].get("branch", 0))
    for record in records:
        if record["seq"] > request["seq"]:
            break
        apply(state, record)
        memory.apply(record)
    return build_prompt(memory, state, request["data"].get("prompt_version")), memory, request["data"]


def render_text(prompt: Prompt) -> str:
    """A prompt as plain text for a person: system, tools by name, then every message block."""
    out = ["=== system ===", prompt.system]
    out.append("=== tools: " + ", ".join(t.name for t in prompt.tools) + " ===")
    for i, message in enumerate(prompt.messages, 1):
        out.append(f"=== message {i}: {message['role']} ===")
        for block in message["content"]:
            kind = block.get("type")
            if kind == "text":
                out.append(block["text"])  # type: ignore[typeddict-item]
            elif kind == "tool_use":
                out.append(f"[tool_use {block['id']}] {block['name']} {block['input']}")  # type: ignore[typeddict-item]
            elif kind == "tool_result":
                flag = " (error)" if block.get("is_error") else ""
                out.append(f"[tool_result {block['tool_use_id']}{flag}]")  # type: ignore[typeddict-item]
                out.extend(inner.get("text", "") for inner in block.get("content", []))  # type: ignore[attr-defined]
    return "\n".join(out)
