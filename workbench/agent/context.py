"""The exact Messages API request of an LLM turn, assembled from the journal-derived memory and state.

The same function builds the request the backend sends and the one `workbench show ID --prompt-at SEQ` prints,
so what a person inspects is what the model saw (up to the prompt wording of this version of the code, which
each llm.request records as a hash).
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable

from workbench.agent.memory import SessionMemory
from workbench.agent.prompts import system_prompt
from workbench.agent.tools import MODEL_TOOLS, TOOLS
from workbench.session.state import SessionState, apply

CACHE = {"type": "ephemeral"}
"""Prompt-cache breakpoint: the API caches the prefix up to and including the block that carries it."""

_SCHEMA_KEYS = ("type", "properties", "required", "items", "enum", "description", "minimum")
"""JSON-schema keys the Messages API accepts in a tool's input_schema (ours may carry more)."""


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in schema.items() if k in _SCHEMA_KEYS and k != "properties"}
    if "properties" in schema:
        out["properties"] = {name: _clean_schema(prop) for name, prop in schema["properties"].items()}
    return out


def tool_definitions() -> list[dict[str, Any]]:
    """The tools as the model is shown them (name, description, input schema), in a fixed order."""
    return [
        {"name": name, "description": TOOLS[name].description, "input_schema": _clean_schema(TOOLS[name].schema)}
        for name in MODEL_TOOLS
    ]


def sha256(text: str) -> str:
    """Hex digest, journaled instead of re-storing the pinned prefix every turn."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def expand(content: list[dict[str, Any]], state: SessionState) -> list[dict[str, Any]]:
    """Content blocks as the API takes them: source references filled in, our own bookkeeping keys removed."""
    out = []
    for block in content:
        if "source_of" in block:
            attempt = state.attempts.get(block["source_of"])
            out.append({"type": "text", "text": attempt.source if attempt else f"(attempt {block['source_of']} "
                                                                               "is not in the journal)"})
        elif block.get("type") == "tool_use":
            out.append({k: block[k] for k in ("type", "id", "name", "input")})
        elif block.get("type") == "tool_result":
            result = {k: v for k, v in block.items() if k in ("type", "tool_use_id", "is_error")}
            result["content"] = expand(block.get("content", []), state)
            out.append(result)
        else:
            out.append(dict(block))
    return out


def build_messages(memory: SessionMemory, state: SessionState, *, cache: bool = True) -> list[dict[str, Any]]:
    """The conversation: the compaction summary (if any), then the window, roles alternating.

    Cache breakpoints go on the summary (it only changes at a compaction) and on the last block of the latest
    message, so each turn reads the whole earlier conversation from the cache and pays only for its delta.
    """
    messages: list[dict[str, Any]] = []
    if memory.summary:
        block = {"type": "text", "text": memory.summary}
        if cache:
            block["cache_control"] = CACHE
        messages.append({"role": "user", "content": [block]})
    for entry in memory.entries:
        content = expand(entry.content, state)
        if messages and messages[-1]["role"] == entry.role:
            messages[-1]["content"] = messages[-1]["content"] + content
        else:
            messages.append({"role": entry.role, "content": content})
    if cache and messages and messages[-1]["content"]:
        last = dict(messages[-1]["content"][-1])
        last["cache_control"] = CACHE
        messages[-1] = {"role": messages[-1]["role"], "content": [*messages[-1]["content"][:-1], last]}
    return messages


def request_body(memory: SessionMemory, state: SessionState, *, model: str, max_tokens: int,
                 cache: bool = True) -> dict[str, Any]:
    """The whole request: model, pinned system prompt, tools and messages."""
    system: dict[str, Any] = {"type": "text", "text": system_prompt(state.goal)}
    if cache:
        system["cache_control"] = CACHE
    return {
        "model": model,
        "max_tokens": max_tokens,
        "system": [system],
        "tools": tool_definitions(),
        "messages": build_messages(memory, state, cache=cache),
    }


def context_at(events: Iterable[Any], seq: int) -> tuple[dict[str, Any] | None, SessionMemory, dict[str, Any]]:
    """The context the model saw at the last llm.request at or before `seq`.

    Args:
        events: the journal's events from seq 1 (Event objects or dicts), in order.
        seq: a journal seq.

    Returns:
        (request body or None when no model request happened by then, the memory at that point, and the
        llm.request data or, for a session without model requests, {}).
    """
    records = [e.to_dict() if hasattr(e, "to_dict") else e for e in events]
    records = [r for r in records if r["seq"] <= seq]
    requests = [r for r in records if r["type"] == "llm.request"]
    state = SessionState()
    if not requests:
        memory = SessionMemory("tools")
        for record in records:
            apply(state, record)
            memory.apply(record)
        return None, memory, {}
    upto = requests[-1]["seq"]
    memory = SessionMemory("messages")
    for record in records:
        if record["seq"] > upto:
            break
        apply(state, record)
        memory.apply(record)
    request = requests[-1]["data"]
    body = request_body(memory, state, model=request.get("model", ""), max_tokens=int(request.get("max_tokens", 0)))
    return body, memory, request


def render_text(body: dict[str, Any]) -> str:
    """A request as plain text for a person: system, tools by name, then every message block."""
    out = ["=== system ==="]
    out.extend(block["text"] for block in body["system"])
    out.append("=== tools: " + ", ".join(t["name"] for t in body["tools"]) + " ===")
    for i, message in enumerate(body["messages"], 1):
        out.append(f"=== message {i}: {message['role']} ===")
        for block in message["content"]:
            kind = block.get("type")
            if kind == "text":
                out.append(block["text"])
            elif kind == "tool_use":
                out.append(f"[tool_use {block['id']}] {block['name']} {block['input']}")
            elif kind == "tool_result":
                flag = " (error)" if block.get("is_error") else ""
                out.append(f"[tool_result {block['tool_use_id']}{flag}]")
                out.extend(inner.get("text", "") for inner in block.get("content", []))
    return "\n".join(out)
