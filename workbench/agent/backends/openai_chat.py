"""The openai backend: the conversation step over any OpenAI-compatible chat-completions API (vLLM, SGLang, Ollama,
llama.cpp's server, OpenAI itself, LiteLLM and other gateways).

OpenAITransport is everything vendor-specific: the neutral prompt as chat messages (the system prompt first, tool
results as `tool` messages right after the reply that asked for them), function tools, the SSE stream (or a whole
reply) assembled into neutral blocks, error classification, the price the person gave, and the pre-run check that
the server is there, knows the model and parses tool calls. The `openai` SDK is an optional extra imported inside
functions only (core modules and the tuner must run without it), with max_retries=0: retries are the conversation
step's, so each one is journaled. The key comes from OPENAI_API_KEY and is never journaled nor shown: the endpoint
(base URL, price, streaming) is journaled instead, so a resume talks to the same server.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from workbench.agent.backends.conversation import ConversationBackend
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
from workbench.journal.events import Block, Endpoint

if TYPE_CHECKING:
    from workbench.agent.context import Prompt

OFFICIAL_URL = "https://api.openai.com/v1"
"""The base URL without --base-url or OPENAI_BASE_URL."""
KEY_VARIABLE = "OPENAI_API_KEY"
NO_KEY = "EMPTY"
"""Sent as the bearer token to a server that needs no key (the SDK insists on one; vLLM's docs use this word)."""

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529})
CONTEXT_WORDS = re.compile(r"context length|context_length|maximum context|context window|context size|"
                           r"max_model_len|maximum model length|longer than the model|prompt is too long|"
                           r"too many tokens|exceeds? the (?:available )?context", re.IGNORECASE)
"""How OpenAI, vLLM, SGLang, llama.cpp and LiteLLM word 'the prompt does not fit the model'."""
TOOL_WORDS = re.compile(r"tool|function.call", re.IGNORECASE)
TOOL_MARKUP = re.compile(r"<tool_call>|<\|tool_call|\[TOOL_CALLS\]|<\|python_tag\|>|<function[=>]|"
                         r"\"name\"\s*:\s*\"read_task\"|\bread_task\s*\(", re.IGNORECASE)
"""A tool call written as text: the model called the tool, but the server did not parse the call."""
KEY_LIKE = re.compile(r"\bsk-[A-Za-z0-9_\-*]{6,}")

PROBE_TEXT = "Connection check before a long session: call the read_task tool once, with no arguments."
PROBE_TOKENS = 512
"""Room for the probe's reply: a tool call needs a few dozen tokens, a thinking model more."""
SERVER_HINT = ("vLLM: serve with --enable-auto-tool-choice --tool-call-parser NAME; SGLang: --tool-call-parser NAME; "
               "llama.cpp: --jinja")


def base_url(given: str | None = None) -> str:
    """The API's base URL: `given` (--base-url or the journal), else OPENAI_BASE_URL, else the official one.

    Raises:
        BackendError: the URL is not http(s).
    """
    url = (given or os.environ.get("OPENAI_BASE_URL") or OFFICIAL_URL).strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BackendError(f"--base-url {url}: not an http(s) URL (e.g. http://localhost:8000/v1)")
    return url


def is_official(url: str) -> bool:
    """True for OpenAI's own API, which always needs a key (any other server may need none)."""
    return urlsplit(url).hostname == "api.openai.com"


def scrub(text: str) -> str:
    """`text` without the key or anything shaped like one: servers echo keys in their 401 messages."""
    key = os.environ.get(KEY_VARIABLE)
    if key:
        text = text.replace(key, "***")
    return KEY_LIKE.sub("sk-***", text)


def _error_fields(exc: BaseException) -> tuple[str, str]:
    """(type or code, message) from an error body: OpenAI's {"error": {...}}, vLLM's {"object": "error", ...},
    a plain {"error": "..."} or none at all."""
    body = getattr(exc, "body", None)
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        kind = str(error.get("code") or error.get("type") or "")
        return kind, str(error.get("message") or "")
    if isinstance(error, str):
        return "", error
    return "", ""


def _short(exc: BaseException) -> str:
    """One line about a failed request: status, error code and message, never a header or a key."""
    kind, message = _error_fields(exc)
    if not message:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    status = getattr(exc, "status_code", None)
    head = " ".join(str(p) for p in (status, kind) if p) or type(exc).__name__
    return scrub(" ".join(f"{head}: {message}".split()))[:300]


def _usage(raw: Any) -> Usage:
    """Chat-completions usage as the journal keeps it: cached prompt tokens apart from the rest."""
    if not isinstance(raw, dict):
        return {}
    details = raw.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    prompt = int(raw.get("prompt_tokens") or 0)
    return {"input_tokens": max(0, prompt - cached), "cache_read_input_tokens": cached,
            "output_tokens": int(raw.get("completion_tokens") or 0)}


def _text(blocks: list[Any]) -> str:
    return "\n".join(b["text"] for b in blocks if b.get("type") == "text")


def chat_messages(message: Any) -> list[dict[str, Any]]:
    """One neutral message as chat messages.

    An assistant message is its text and its tool calls (arguments as JSON; a call whose arguments did not parse
    goes back as {}). A user message becomes one `tool` message per tool result, first, since the API wants them
    right after the reply that asked for them, then one user message with its text.
    """
    blocks = message["content"]
    if message["role"] == "assistant":
        text = "\n\n".join(b["text"] for b in blocks if b.get("type") == "text")
        calls = [{"id": b["id"], "type": "function",
                  "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {}, ensure_ascii=False)}}
                 for b in blocks if b.get("type") == "tool_use"]
        # No text: null beside tool calls, "" for an empty reply (the API wants one of the two).
        out: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
        if calls:
            out["tool_calls"] = calls
        return [out]
    tools = [{"role": "tool", "tool_call_id": b["tool_use_id"], "content": _text(b.get("content", []))}
             for b in blocks if b.get("type") == "tool_result"]
    text = "\n\n".join(b["text"] for b in blocks if b.get("type") == "text")
    return tools + ([{"role": "user", "content": text}] if text else [])


class _Assembly:
    """A reply being assembled from stream chunks (or from one whole reply): text, tool calls by index, meta."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.finish: str | None = None
        self.id: str | None = None
        self.model: str | None = None
        self.usage: Usage = {}

    def chunk(self, data: dict[str, Any]) -> None:
        """Fold one chunk (or a whole completion, whose `message` stands where a chunk's `delta` does)."""
        self.id = self.id or data.get("id")
        self.model = self.model or data.get("model")
        if data.get("usage"):
            self.usage = _usage(data["usage"])
        for choice in data.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue  # n > 1 is never asked for
            delta = choice.get("delta") or choice.get("message") or {}
            if delta.get("content"):
                self.text.append(delta["content"])
            for position, call in enumerate(delta.get("tool_calls") or []):
                self._call(position, call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]

    def _call(self, position: int, call: dict[str, Any]) -> None:
        index = call.get("index")
        if not isinstance(index, int):  # a server that numbers nothing: a new id starts a new call
            fresh = call.get("id") and all(c["id"] != call["id"] for c in self.calls.values())
            index = len(self.calls) if fresh or not self.calls else max(self.calls)
        slot = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        function = call.get("function") or {}
        if call.get("id"):
            slot["id"] = call["id"]
        name = function.get("name") or ""
        if name and name != slot["name"]:  # some servers repeat the whole name in every chunk
            slot["name"] += name
        slot["arguments"] += function.get("arguments") or ""

    def reply(self) -> Reply:
        """The neutral reply: its text, then its tool calls in order (each with an id of its own: a server that
        gives none, or the same one twice, would leave calls that cannot be told apart)."""
        content: list[Block] = []
        text = "".join(self.text)
        if text.strip():
            content.append({"type": "text", "text": text})
        ids: set[str] = set()
        for index in sorted(self.calls):
            call = self.calls[index]
            ref = call["id"] if call["id"] and call["id"] not in ids else f"call_{uuid.uuid4().hex[:24]}"
            ids.add(ref)
            block = tool_use(ref, call["name"], call["arguments"])
            if "malformed" in block and self.finish == "length":
                block["malformed"] += " (the reply was cut off at max_tokens)"
            content.append(block)
        return Reply(content, self.finish, self.id, self.model, self.usage)


class OpenAITransport(SdkTransport):
    """Chat completions through the `openai` SDK at one endpoint (see the module docstring)."""

    name = "openai"
    credential_hint = f"{KEY_VARIABLE} set (or --base-url URL of a server that needs no key)"

    def __init__(self, endpoint: Endpoint | None = None, *, client: Any = None, timeout: float = 600.0) -> None:
        super().__init__(client, timeout=timeout)
        endpoint = endpoint or {}
        self.base_url = base_url(endpoint.get("base_url"))
        self.price: tuple[float, ...] | None = tuple(endpoint["price"]) if endpoint.get("price") else None
        """USD per million input, output (and cached input) tokens; None: unknown, counted as 0."""
        self.stream = endpoint.get("stream", True)

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint in force, as journaled: the resolved base URL, the price when one was given, streaming."""
        out: Endpoint = {"base_url": self.base_url, "stream": self.stream}
        if self.price is not None:
            out["price"] = list(self.price)
        return out

    def make_client(self, timeout: float) -> Any:
        """An `openai` client for the base URL with max_retries=0 and this timeout."""
        import openai

        return openai.OpenAI(api_key=os.environ.get(KEY_VARIABLE) or NO_KEY, base_url=self.base_url, max_retries=0,
                             timeout=timeout)

    # -- before a session ------------------------------------------------------------------------
    def credentials(self) -> str | None:
        """OPENAI_API_KEY when set; a server other than OpenAI's may need none; OpenAI's own needs one."""
        if os.environ.get(KEY_VARIABLE):
            return KEY_VARIABLE
        return None if is_official(self.base_url) else f"none needed (the server at {self.base_url})"

    def served_models(self) -> list[str]:
        """The models the server lists (GET /models), to pick the one a local server serves.

        Raises:
            BackendError: the server cannot be reached or refuses the listing.
        """
        import openai

        try:
            return [model.id for model in self.client(timeout=30.0).models.list()]
        except openai.APIConnectionError as exc:
            raise BackendError(self._unreachable(exc)) from None
        except openai.APIStatusError as exc:
            raise BackendError(f"the server at {self.base_url} did not list its models ({_short(exc)}): pass "
                               "--model") from None

    def check_access(self, model: str) -> str | None:
        """One small request with the session's tools, so an unreachable server, a rejected key, an unknown model
        or a server that does not parse tool calls is one line before a session is made, not a dead run.

        Returns:
            None, or a one-line warning: the check could not be completed, or no price is known for the model.

        Raises:
            BackendError: the server is unreachable, rejects the key, does not serve the model or cannot call tools.
        """
        import openai

        from workbench.agent.context import Prompt
        from workbench.agent.tools import specs

        prompt = Prompt("You are being checked before a session starts.", specs(),
                        [{"role": "user", "content": [{"type": "text", "text": PROBE_TEXT}]}], False)
        body = {**self.request_body(prompt, model=model, max_tokens=PROBE_TOKENS), "stream": False}
        body.pop("stream_options", None)
        warnings = [] if self.price is not None else [
            f"no price is known for model {model!r}: its tokens count as $0 (set one with --price IN,OUT, USD per "
            "million tokens)"]
        try:
            completion = self.client(timeout=120.0).chat.completions.create(**body)
        except openai.APIConnectionError as exc:
            raise BackendError(self._unreachable(exc)) from None
        except openai.APIStatusError as exc:
            self._refuse(exc, model)
            return "; ".join([f"could not check the server before starting ({_short(exc)}); starting anyway",
                              *warnings])
        reply = _Assembly()
        reply.chunk(completion.to_dict())
        if not reply.calls:
            written = "".join(reply.text)
            if TOOL_MARKUP.search(written):
                raise BackendError(f"model {model!r} at {self.base_url} wrote its tool call as text: the server does "
                                   f"not parse tool calls ({SERVER_HINT})")
            cut = " (its reply hit the probe's token limit)" if reply.finish == "length" else ""
            warnings.insert(0, f"model {model!r} answered a request to call a tool without calling one{cut}; if it "
                               "cannot call tools the run stops after three replies without a tool call")
        return "; ".join(warnings) or None

    def _unreachable(self, exc: BaseException) -> str:
        return f"cannot reach the model server at {self.base_url} ({_short(exc)}): is it running, and is that its URL?"

    def _refuse(self, exc: Any, model: str) -> None:
        """Raise the BackendError a refused check means; return when the refusal may pass (overload, 5xx)."""
        status = exc.status_code
        kind, message = _error_fields(exc)
        if status == 401:
            raise BackendError(f"the server at {self.base_url} rejected the key (401): check {KEY_VARIABLE}")
        if status == 403:
            raise BackendError(f"the server at {self.base_url} refused this key access ({_short(exc)}): check the "
                               "key's project and permissions")
        if status == 404:
            if "model" in message.lower() or kind == "model_not_found":
                raise BackendError(f"the server at {self.base_url} does not serve model {model!r} (404): pick "
                                   "another with --model")
            raise BackendError(f"the server at {self.base_url} has no chat completions API (404): does the base URL "
                               "need its /v1?")
        if status == 429 and kind == "insufficient_quota":
            raise BackendError(f"the API says this key is out of quota (429 insufficient_quota): {_short(exc)}")
        if status in (400, 422, 500, 501) and TOOL_WORDS.search(message):
            raise BackendError(f"the server at {self.base_url} cannot call tools with model {model!r} "
                               f"({_short(exc)}): {SERVER_HINT}; or pick a model that can")
        if status not in RETRYABLE_STATUS:
            raise BackendError(f"the server at {self.base_url} refused a first request: {_short(exc)}")

    # -- the conversation --------------------------------------------------------------------------
    def request_body(self, prompt: "Prompt", *, model: str, max_tokens: int) -> dict[str, Any]:
        """The chat-completions request: system prompt, the conversation, function tools, and the reply length
        (max_completion_tokens for OpenAI, whose newer models refuse max_tokens; max_tokens, which every other
        server takes, elsewhere)."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": prompt.system}]
        for message in prompt.messages:
            messages.extend(chat_messages(message))
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "tools": [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                        "parameters": t.parameters}} for t in prompt.tools],
            # Explicit, because a server that cannot parse tool calls then says so instead of never calling one.
            "tool_choice": "auto",
            "max_completion_tokens" if is_official(self.base_url) else "max_tokens": max_tokens,
            "stream": self.stream,
        }
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def receive(self, body: dict[str, Any]) -> Reply:
        """Send one request and assemble its reply (streamed or whole, as the body asks).

        Tool arguments are parsed here, so one malformed argument string becomes a tool error for that call.

        Raises:
            IncompleteStream: the stream ended before its finish_reason.
        """
        reply = _Assembly()
        if not body.get("stream"):
            reply.chunk(self.client().chat.completions.create(**body).to_dict())
            return reply.reply()
        with self.client().chat.completions.create(**body) as stream:
            for chunk in stream:
                reply.chunk(chunk.to_dict())
        if reply.finish is None:
            raise IncompleteStream("the reply stream ended before its finish_reason")
        return reply.reply()

    def classify(self, exc: BaseException) -> TransportError | None:
        """A failure of this API as a TransportError (the module's classify())."""
        return classify(exc)

    def cost(self, model: str, usage: Usage) -> tuple[float, bool]:
        """USD at the price the person gave (cached input at the input price unless a third figure says
        otherwise); 0 and False without one."""
        if self.price is None:
            return 0.0, False
        p_in, p_out, p_cached = (*self.price, self.price[0])[:3]
        total = (usage.get("input_tokens", 0) * p_in + usage.get("cache_read_input_tokens", 0) * p_cached
                 + usage.get("output_tokens", 0) * p_out)
        return round(total / 1e6, 8), True


def classify(exc: BaseException) -> TransportError | None:
    """An SDK or network exception as a TransportError; None for anything that is not a failed request."""
    import openai

    if isinstance(exc, openai.APIStatusError):
        status, (kind, message) = exc.status_code, _error_fields(exc)
        if status == 429 and kind == "insufficient_quota":
            return TransportError(f"the API says this key is out of quota: {_short(exc)}", "fatal", status=status)
        if status in RETRYABLE_STATUS:
            return TransportError(_short(exc), "retryable", status=status, retry_after=retry_after(exc))
        if status == 413 or (status in (400, 422) and CONTEXT_WORDS.search(f"{kind} {message}")):
            return TransportError(_short(exc), "context_length", status=status)
        if status == 401:
            return TransportError(f"the server rejected the key (401): check {KEY_VARIABLE}", "fatal", status=401)
        return TransportError(f"model API error: {_short(exc)}", "fatal", status=status)
    lost = lost_reply(exc, openai.APIConnectionError, _short)
    if lost is not None:
        return lost
    if isinstance(exc, openai.APIError):
        # An error event inside a 200 stream (the server failed mid-reply): a retry may cure it unless it says the
        # prompt does not fit.
        kind, message = _error_fields(exc)
        failure = "context_length" if CONTEXT_WORDS.search(f"{kind} {message}") else "retryable"
        return TransportError(_short(exc), failure, status=200)
    return None


def create(options: BackendOptions) -> ConversationBackend:
    """The registry's factory: the model is --model (or the journaled one), else the one model the server lists.

    Raises:
        BackendError: no --model, and the server lists none or several (or cannot be asked).
    """
    transport = OpenAITransport(options.endpoint)
    model = options.model
    if not model:
        served = transport.served_models()
        if len(served) != 1:
            listed = ", ".join(served[:8]) + (", ..." if len(served) > 8 else "")
            raise BackendError(f"the server at {transport.base_url} serves {len(served)} models"
                               f"{f' ({listed})' if served else ''}: pick one with --model")
        model = served[0]
    return ConversationBackend("openai", transport, model, seed_source=options.seed_source,
                               endpoint=transport.endpoint)


SPEC = BackendSpec("openai", "any OpenAI-compatible chat-completions server: vLLM, SGLang, Ollama, llama.cpp, OpenAI, "
                   "gateways (--base-url, OPENAI_API_KEY)", create, transport=OpenAITransport, requires=("openai",),
                   endpoint_keys=("base_url", "price", "stream"))
"""The registry entry (pyproject.toml: workbench.backends, openai)."""
