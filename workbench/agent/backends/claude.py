"""The claude backend: the conversation step over the Anthropic Messages API (tool use, streamed, prompt-cached).

AnthropicTransport is everything vendor-specific: the request body with its cache breakpoints, the SSE stream
assembled into neutral blocks, error classification and retry-after, prices, and the credential and access
checks. The `anthropic` SDK is imported inside functions only: core modules must import without it (the GPU box
has none). The client runs with max_retries=0: retries are the conversation step's, so each one is journaled.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from workbench.agent.backends.conversation import ConversationBackend, RetryPolicy
from workbench.agent.backends.registry import BackendOptions, BackendSpec
from workbench.agent.backends.transport import (
    BackendError,
    IncompleteStream,
    Reply,
    SdkTransport,
    TransportError,
    Usage,
    lost_reply,
    retry_after,
    tool_use,
)

if TYPE_CHECKING:
    from workbench.agent.context import Prompt
    from workbench.journal.events import Endpoint

DEFAULT_MODEL = "claude-opus-4-6"
"""Used when neither --model nor WORKBENCH_MODEL names one."""

CREDENTIALS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
"""The environment variables the SDK reads a credential from, in its order."""

CACHE = {"type": "ephemeral"}
"""Prompt-cache breakpoint: the API caches the prefix up to and including the block that carries it."""

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


def price(model: str) -> tuple[float, float, bool]:
    """(input, output) USD per million tokens for `model`, and whether the model is in the table."""
    hits = [key for key in PRICES if key in model]
    if not hits:
        return (*UNKNOWN_PRICE, False)
    return (*PRICES[max(hits, key=len)], True)


def cost_usd(model: str, usage: Usage) -> float:
    """What one response cost: uncached input, cache writes and reads, and output."""
    p_in, p_out, _ = price(model)
    total = (usage.get("input_tokens", 0) * p_in
             + usage.get("cache_creation_input_tokens", 0) * p_in * CACHE_WRITE
             + usage.get("cache_read_input_tokens", 0) * p_in * CACHE_READ
             + usage.get("output_tokens", 0) * p_out)
    return round(total / 1e6, 8)


def credentials() -> str | None:
    """The variable that holds the credential the SDK will use, or None (the one place this is read)."""
    return next((name for name in CREDENTIALS if os.environ.get(name)), None)


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
    cause = exc.__cause__
    if status is None and cause is not None and str(cause):
        message += f" ({str(cause).splitlines()[0]})"  # the SDK's "Connection error." hides the why: refused, ...
    head = " ".join(str(p) for p in (status, kind) if p) or type(exc).__name__
    return f"{head}: {message}"[:240]


def classify(exc: BaseException) -> TransportError | None:
    """An SDK or network exception as a TransportError; None for anything that is not a failed request."""
    import anthropic

    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        if status in RETRYABLE_STATUS or (status == 200 and _error_type(exc) in RETRYABLE_TYPES):
            # An error event inside a 200 stream: the status says nothing, the error type does.
            return TransportError(_short(exc), "retryable", status=status, retry_after=retry_after(exc))
        if status == 400 and "prompt is too long" in _short(exc):
            return TransportError(_short(exc), "context_length", status=status)
        if status == 401:
            return TransportError("the API rejected the key (401): check ANTHROPIC_API_KEY", "fatal", status=401)
        if status == 403:
            return TransportError("the API refused this key access (403): check its workspace and permissions",
                                  "fatal", status=403)
        return TransportError(f"model API error: {_short(exc)}", "fatal", status=status)
    return lost_reply(exc, anthropic.APIConnectionError, _short)


class AnthropicTransport(SdkTransport):
    """The Messages API through the `anthropic` SDK, from its own environment (key or token, base URL)."""

    name = "anthropic"
    credential_hint = "ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) set"

    def make_client(self, timeout: float) -> Any:
        """An `anthropic` client with max_retries=0 and this timeout."""
        import anthropic

        return anthropic.Anthropic(max_retries=0, timeout=timeout)

    def credentials(self) -> str | None:
        """ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN, whichever the SDK will use."""
        return credentials()

    @property
    def base_url(self) -> str:
        """The SDK's base URL: ANTHROPIC_BASE_URL, else the public API."""
        return str(self.client().base_url)

    def check_access(self, model: str) -> str | None:
        """Ask the API about `model` (GET /v1/models/ID) so a bad key or model fails in one line, not mid-run."""
        import anthropic

        try:
            self.client(timeout=30.0).models.retrieve(model)
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

    def request_body(self, prompt: "Prompt", *, model: str, max_tokens: int) -> dict[str, Any]:
        """The Messages API request, with cache breakpoints on the system prompt, the compaction summary and the
        last block of the latest message, so each turn reads the earlier conversation from the cache."""
        messages = [{"role": m["role"], "content": list(m["content"])} for m in prompt.messages]
        if prompt.summary and messages:
            messages[0]["content"][0] = {**messages[0]["content"][0], "cache_control": CACHE}
        if messages and messages[-1]["content"]:
            messages[-1]["content"][-1] = {**messages[-1]["content"][-1], "cache_control": CACHE}
        return {
            "model": model,
            "max_tokens": max_tokens,
            "system": [{"type": "text", "text": prompt.system, "cache_control": CACHE}],
            "tools": [{"name": t.name, "description": t.description, "input_schema": t.parameters}
                      for t in prompt.tools],
            "messages": messages,
        }

    def receive(self, body: dict[str, Any]) -> Reply:
        """Stream one reply and assemble it: content blocks, stop reason, usage, ids.

        Tool arguments are parsed here rather than by the SDK's accumulator, so one malformed argument string
        becomes a tool error for that call instead of losing the whole reply.

        Raises:
            IncompleteStream: the stream ended before message_stop.
        """
        blocks: dict[int, dict[str, Any]] = {}
        usage: Usage = {}
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
        return Reply(content, meta["stop_reason"], meta.get("id"), meta.get("model"), usage)  # type: ignore[arg-type]

    def classify(self, exc: BaseException) -> TransportError | None:
        """A failure of this API as a TransportError (the module's classify())."""
        return classify(exc)

    def cost(self, model: str, usage: Usage) -> tuple[float, bool]:
        """USD from the price table, and whether the model is in it."""
        return cost_usd(model, usage), price(model)[2]


def _usage(usage: Any) -> Usage:
    out: Usage = {}
    for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        value = getattr(usage, key, None)
        if isinstance(value, int):
            out[key] = value  # type: ignore[literal-required]
    return out


def _finish_block(block: dict[str, Any]) -> dict[str, Any]:
    if block["type"] != "tool_use":
        return block
    return dict(tool_use(block["id"], block["name"], block["json"]))


def claude_backend(model: str | None, *, seed_source: str = "", client: Any = None, max_tokens: int = 8192,
                   retry: RetryPolicy = RetryPolicy()) -> ConversationBackend:
    """The claude backend: the conversation step over an AnthropicTransport (`client` for tests)."""
    return ConversationBackend("claude", AnthropicTransport(client), model or os.environ.get("WORKBENCH_MODEL")
                               or DEFAULT_MODEL, seed_source=seed_source, max_tokens=max_tokens, retry=retry)


def create(options: BackendOptions) -> ConversationBackend:
    """The registry's factory (see backends.registry)."""
    return claude_backend(options.model, seed_source=options.seed_source)


def transport(endpoint: Endpoint) -> AnthropicTransport:
    """The registry's transport factory: the SDK's own environment says where the API is (no endpoint keys)."""
    return AnthropicTransport()


SPEC = BackendSpec("claude", "Claude through the Anthropic Messages API (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL)",
                   create, transport=transport, requires=("anthropic",))
"""The registry entry (pyproject.toml: workbench.backends, claude)."""
