"""The Claude backend: the Messages API with tool use, streamed, retried, cached and journaled turn by turn.

The backend holds no conversation of its own. Its context is runtime.memory, a fold of the journal: each
llm.request journals only the user message it adds (tool results, new nudges, the state block), each
llm.response the assistant message, so a resume rebuilds the exact context from the journal and
`workbench show --prompt-at SEQ` can print it. The `anthropic` SDK is imported inside functions only: core
modules must import without it (the GPU box has none).

Retries are ours, not the SDK's (the client runs with max_retries=0), so each failed try is journaled as an
llm.response with ok: false, its error and the wait chosen; a retry-after header is honoured, otherwise the
wait backs off exponentially with jitter. The wait is cooperative: a stop ends it at once and the journaled
request is simply sent again on resume.
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import time
from datetime import datetime, timezone
from typing import Any

from workbench.agent.backends.base import Finish, ToolCall
from workbench.agent.context import request_body, sha256, tool_definitions
from workbench.agent.memory import estimate_tokens
from workbench.agent.prompts import (
    PROMPTS_VERSION,
    SILENT_TEXT,
    intro_text,
    nudge_message,
    render_tool_result,
    revoke_message,
    state_block,
    system_prompt,
)
from workbench.session.state import SessionState
from workbench.tasks import Task

DEFAULT_MODEL = "claude-opus-4-6"
"""Used when neither --model nor WORKBENCH_MODEL names one."""

DEFAULT_CONTEXT_TOKENS = 120_000
"""Compaction budget for Claude: well inside a 200k-token window, leaving room for long tool results."""

MAX_SILENT_TURNS = 3
"""Replies in a row without a tool call after which the run finishes instead of paying for more."""

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
RETRYABLE_TYPES = frozenset({"overloaded_error", "rate_limit_error", "api_error", "timeout_error"})
"""Error types a stream can report mid-response (HTTP 200 already sent) that a retry may cure."""

PRICES: dict[str, tuple[float, float]] = {
    "claude-opus-4-0": (15.0, 75.0),
    "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4-2025": (15.0, 75.0),
    "claude-3-opus": (15.0, 75.0),
    "opus": (5.0, 25.0),
    "sonnet": (3.0, 15.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "claude-3-haiku": (0.25, 1.25),
    "haiku": (1.0, 5.0),
}
"""USD per million input / output tokens, matched by the longest key contained in the model name."""
UNKNOWN_PRICE = (15.0, 75.0)
"""An unknown model is priced as the dearest known one, so --max-cost stops early rather than late."""
CACHE_WRITE, CACHE_READ = 1.25, 0.1
"""Prompt-cache writes and reads, as multiples of the input price."""


class BackendError(Exception):
    """The model API cannot be used (rejected key, unknown model, retries exhausted); one line for the person."""


class IncompleteStream(Exception):
    """The stream ended without message_stop (a proxy or the network dropped it): retried."""


def price(model: str) -> tuple[float, float, bool]:
    """(input, output) USD per million tokens for `model`, and whether the model is in the table."""
    hits = [key for key in PRICES if key in model]
    if not hits:
        return (*UNKNOWN_PRICE, False)
    return (*PRICES[max(hits, key=len)], True)


def cost_usd(model: str, usage: dict[str, int]) -> float:
    """What one response cost: uncached input, cache writes and reads, and output."""
    p_in, p_out, _ = price(model)
    total = (usage.get("input_tokens", 0) * p_in
             + usage.get("cache_creation_input_tokens", 0) * p_in * CACHE_WRITE
             + usage.get("cache_read_input_tokens", 0) * p_in * CACHE_READ
             + usage.get("output_tokens", 0) * p_out)
    return round(total / 1e6, 8)


def have_credentials() -> bool:
    """Whether the environment carries a key or token the SDK will use."""
    return bool(os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN"))


def make_client(timeout: float = 600.0) -> Any:
    """An Anthropic client from the SDK's own environment (key, token, base URL), with retries left to us."""
    import anthropic

    return anthropic.Anthropic(max_retries=0, timeout=timeout)


def check_access(model: str, client: Any = None) -> str | None:
    """Ask the API about `model` before a run starts, so a bad key or model fails in one line, not mid-run.

    Returns:
        None when the key and model are accepted, else a warning to print when the check itself could not be
        done (network, server error): the run may still work, so it is not refused for that.

    Raises:
        BackendError: the key is rejected (401/403) or the model is unknown (404).
    """
    import anthropic

    client = client or make_client(timeout=30.0)
    try:
        client.models.retrieve(model)
    except anthropic.AuthenticationError as exc:
        raise BackendError(f"the API rejected the key (401 {_error_type(exc) or 'authentication_error'}): "
                           "check ANTHROPIC_API_KEY") from None
    except anthropic.PermissionDeniedError:
        raise BackendError("the API refused this key access (403 permission_error): check its workspace and "
                           "permissions") from None
    except anthropic.NotFoundError:
        raise BackendError(f"the API does not know model {model!r} (404): pick another with --model") from None
    except (anthropic.APIStatusError, anthropic.APIConnectionError) as exc:
        return f"could not check the key and model before starting ({_short(exc)}); starting anyway"
    return None


def _error_type(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            return str(error.get("type", ""))
    return ""


def _short(exc: BaseException) -> str:
    """One line about an API failure, never a header (the key travels in one)."""
    status = getattr(exc, "status_code", None)
    kind = _error_type(exc)
    body = getattr(exc, "body", None)
    message = ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = str(body["error"].get("message", ""))
    if not message:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    head = " ".join(str(p) for p in (status, kind) if p) or type(exc).__name__
    return f"{head}: {message}"[:240]


def _retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (retry-after-ms, retry-after in seconds or as an HTTP date)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        if headers.get("retry-after-ms"):
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        value = headers.get("retry-after")
        if not value:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())
    except (TypeError, ValueError):
        return None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Network errors the SDK lets through while a stream is read (its HTTP library's own classes)."""
    found: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        error = getattr(module, "TransportError", None)
        if isinstance(error, type):
            found.append(error)
    return tuple(found)


class ClaudeBackend:
    """An LLM strategy: each step runs the next tool call of the latest reply, or asks the model for a reply."""

    name = "claude"
    memory_kind = "messages"
    context_tokens = DEFAULT_CONTEXT_TOKENS

    def __init__(
        self,
        model: str | None,
        *,
        seed_source: str = "",
        client: Any = None,
        max_tokens: int = 8192,
        max_retries: int = 8,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        max_wait: float = 900.0,
    ) -> None:
        self.model = model or os.environ.get("WORKBENCH_MODEL") or DEFAULT_MODEL
        self.seed_source = seed_source
        """The kernel the session starts from (read_kernel shows it before any attempt exists)."""
        self.max_tokens = max_tokens
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_wait = max_wait
        """Longest wait honoured from a retry-after header."""
        self._client = client
        self._rt: Any = None
        self._overhead: tuple[str, int] | None = None

    # -- runtime hooks -------------------------------------------------------------------------
    def bind(self, runtime: Any) -> None:
        """Called by the runtime when a run starts: emit, memory, wait and budget come from it."""
        self._rt = runtime

    def context_overhead(self, state: SessionState) -> int:
        """Estimated tokens of the pinned prefix (system prompt and tool definitions)."""
        system = system_prompt(state.goal)
        if self._overhead is None or self._overhead[0] != system:
            tools = json.dumps(tool_definitions())
            self._overhead = (system, estimate_tokens(system) + estimate_tokens(tools))
        return self._overhead[1]

    def acknowledge(self, nudge: dict[str, Any], state: SessionState, task: Task) -> str:
        """Nudges reach the model with its next request; persistent ones ride in every state block after that."""
        scope = "; repeated in every turn until revoked" if nudge.get("persistent") else ""
        return f"claude: queued for the model's next turn{scope}"

    # -- the step ------------------------------------------------------------------------------
    def next_action(self, state: SessionState, task: Task) -> ToolCall | Finish | None:
        """The next tool call of the latest reply; when all have run, a new request (journaled) and its reply."""
        memory = self._rt.memory
        for _ in range(MAX_SILENT_TURNS + 1):
            if not memory.pending:
                action = self._next_call(memory)
                if action is not None:
                    return action
                finished = self._finished(memory)
                if finished is not None:
                    return finished
                if memory.silent >= MAX_SILENT_TURNS:
                    return Finish(f"the model replied {memory.silent} times in a row without calling a tool")
                self._request(state, memory)
            if not self._exchange(state, memory):
                return None
        return None

    def _next_call(self, memory: Any) -> ToolCall | None:
        for block in memory.tool_uses():
            if block["id"] in memory.calls:
                continue
            error = None
            if "malformed" in block:
                error = f"your arguments for {block['name']} were not valid JSON ({block['malformed']}); call it again"
            return ToolCall(block["name"], dict(block.get("input") or {}), ref=block["id"], error=error)
        return None

    def _finished(self, memory: Any) -> Finish | None:
        """Finish when the model's finish call succeeded in this run (a person who resumes after it gets a turn)."""
        for block in memory.tool_uses():
            if block["name"] != "finish":
                continue
            call = memory.calls.get(block["id"])
            result = call and call["result"]
            if result and result.get("ok") and call["result_seq"] > memory.run_started_seq:
                return Finish(f"the model finished: {block['input'].get('reason', '')}".strip())
        return None

    def _delta(self, state: SessionState, memory: Any) -> list[dict[str, Any]]:
        """The user message this request adds: tool results, the person's new words, the state block."""
        blocks: list[dict[str, Any]] = []
        if memory.response is None:
            blocks.append({"type": "text", "text": intro_text()})
        for block in memory.tool_uses():
            call = memory.calls.get(block["id"])
            content, is_error = render_tool_result(call["call"] if call else {"tool": block["name"]},
                                                   call["result"] if call else None, state)
            result = {"type": "tool_result", "tool_use_id": block["id"], "content": content}
            if is_error:
                result["is_error"] = True
            blocks.append(result)
        if memory.response is not None and not memory.tool_uses():
            blocks.append({"type": "text", "text": SILENT_TEXT})
        for nudge in state.nudges:
            if nudge["seq"] > memory.last_request_seq:
                blocks.append({"type": "text", "text": nudge_message(nudge)})
        by_id = {n["id"]: n for n in state.nudges}
        for seq, nudge_id in memory.revoked:
            if seq > memory.last_request_seq and nudge_id in by_id:
                blocks.append({"type": "text", "text": revoke_message(by_id[nudge_id])})
        blocks.append({"type": "text", "text": state_block(state)})
        return [{"role": "user", "content": blocks}]

    def _request(self, state: SessionState, memory: Any) -> None:
        """Journal the next request (compacting first when the context would pass its budget)."""
        delta = self._delta(state, memory)
        delta_tokens = sum(estimate_tokens(m["content"], memory.source_chars) for m in delta)
        # A compaction never touches the delta: it replaces older turns, and the delta is built from state.
        self._rt.maybe_compact(extra_tokens=delta_tokens)
        system = system_prompt(state.goal)
        limit = self._rt.budget.context_tokens or self.context_tokens
        self._rt.emit("llm.request", {
            "turn": memory.turn + 1,
            "model": self.model,
            "max_tokens": self.max_tokens,
            "prompt_version": PROMPTS_VERSION,
            "system_sha256": sha256(system),
            "delta": delta,
            "context_tokens": self.context_overhead(state) + memory.tokens() + delta_tokens,
            "budget_tokens": limit,
        })

    # -- one exchange with the API ---------------------------------------------------------------
    def _exchange(self, state: SessionState, memory: Any) -> bool:
        """Send the journaled request until a reply is journaled; False when a stop cut a retry wait short."""
        body = request_body(memory, state, model=self.model, max_tokens=self.max_tokens)
        retryable = self._retryable_errors()
        import anthropic

        for attempt in range(1, self.max_retries + 2):
            started = time.monotonic()
            try:
                reply = self._stream(body)
            except retryable as exc:
                if isinstance(exc, anthropic.APIStatusError) and not self._worth_retrying(exc):
                    raise self._fatal(exc) from None
                if attempt > self.max_retries:
                    raise BackendError(f"model API still failing after {attempt} tries: {_short(exc)}") from None
                wait = self._wait_for(exc, attempt)
                self._rt.emit("llm.response", {
                    "ok": False, "turn": memory.turn, "try": attempt, "error": _short(exc),
                    "status": getattr(exc, "status_code", None) or 0, "retry_in": round(wait, 3),
                    "retry_after": _retry_after(exc) is not None,
                })
                self._rt.notify(f"model API: {_short(exc)}; retry {attempt} in {wait:.1f} s", "warning")
                if self._rt.wait(wait):
                    return False
                continue
            usage = reply.pop("usage")
            known = price(self.model)[2]
            self._rt.emit("llm.response", {
                "ok": True, "turn": memory.turn, "try": attempt, **reply, **usage,
                "cost_usd": cost_usd(self.model, usage), "priced": known,
                "ms": round((time.monotonic() - started) * 1000, 1),
            })
            return True
        return False

    @staticmethod
    def _retryable_errors() -> tuple[type[BaseException], ...]:
        import anthropic

        return (anthropic.APIStatusError, anthropic.APIConnectionError, IncompleteStream, *_transport_errors())

    @staticmethod
    def _worth_retrying(exc: Any) -> bool:
        if exc.status_code in RETRYABLE_STATUS:
            return True
        # An error event inside a 200 stream: the status says nothing, the error type does.
        return exc.status_code == 200 and _error_type(exc) in RETRYABLE_TYPES

    @staticmethod
    def _fatal(exc: Any) -> BackendError:
        if exc.status_code == 401:
            return BackendError("the API rejected the key (401): check ANTHROPIC_API_KEY")
        if exc.status_code == 403:
            return BackendError("the API refused this key access (403): check its workspace and permissions")
        return BackendError(f"model API error: {_short(exc)}")

    def _wait_for(self, exc: BaseException, attempt: int) -> float:
        asked = _retry_after(exc)
        if asked is not None:
            return min(asked, self.max_wait)
        backoff = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
        return backoff * random.uniform(0.75, 1.25)

    def client(self) -> Any:
        """The SDK client, made on first use (so importing this module never imports the SDK)."""
        if self._client is None:
            self._client = make_client()
        return self._client

    def _stream(self, body: dict[str, Any]) -> dict[str, Any]:
        """Stream one reply and assemble it: content blocks, stop reason, usage, ids.

        Tool arguments are parsed here rather than by the SDK's accumulator, so one malformed argument string
        becomes a tool error for that call instead of losing the whole reply.
        """
        blocks: dict[int, dict[str, Any]] = {}
        usage: dict[str, int] = {}
        meta: dict[str, Any] = {"stop_reason": None}
        complete = False
        with self.client().messages.create(**body, stream=True) as stream:
            for event in stream:
                kind = event.type
                if kind == "message_start":
                    meta["id"], meta["model"] = event.message.id, event.message.model
                    usage.update(_usage(event.message.usage))
                elif kind == "content_block_start":
                    cb = event.content_block
                    if cb.type == "text":
                        blocks[event.index] = {"type": "text", "text": cb.text or ""}
                    elif cb.type == "tool_use":
                        blocks[event.index] = {"type": "tool_use", "id": cb.id, "name": cb.name, "json": ""}
                elif kind == "content_block_delta" and event.index in blocks:
                    delta = event.delta
                    if delta.type == "text_delta":
                        blocks[event.index]["text"] += delta.text
                    elif delta.type == "input_json_delta":
                        blocks[event.index]["json"] += delta.partial_json
                elif kind == "message_delta":
                    meta["stop_reason"] = event.delta.stop_reason
                    usage.update(_usage(event.usage))
                elif kind == "message_stop":
                    complete = True
        if not complete:
            raise IncompleteStream("the reply stream ended before message_stop")
        content = [_finish_block(blocks[i]) for i in sorted(blocks)]
        content = [b for b in content if b.get("type") != "text" or b["text"]]
        return {"content": content, "stop_reason": meta["stop_reason"], "id": meta.get("id"),
                "model": meta.get("model"), "usage": usage}


def _usage(usage: Any) -> dict[str, int]:
    out = {}
    for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        value = getattr(usage, key, None)
        if isinstance(value, int):
            out[key] = value
    return out


def _finish_block(block: dict[str, Any]) -> dict[str, Any]:
    if block["type"] != "tool_use":
        return block
    raw = block.pop("json")
    try:
        value = json.loads(raw) if raw.strip() else {}
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, got {type(value).__name__}")
    except ValueError as exc:
        return {**block, "input": {}, "malformed": f"{str(exc).splitlines()[0][:120]}; got {raw[:200]!r}"}
    return {**block, "input": value}
