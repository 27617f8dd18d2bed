"""The Transport protocol: what a model API must provide to the vendor-neutral conversation step.

A transport turns the neutral prompt (system text, tool specs, messages of neutral content blocks: text, tool_use
with id/name/input, tool_result) into its API's request, streams one reply back as neutral blocks with neutral
usage, classifies its failures, prices usage, and checks credentials and access before a session is made. The
Anthropic Messages API is one implementation (backends/claude.py), an OpenAI-compatible chat-completions API the
second (backends/openai_chat.py); SdkTransport is what the two share as transports over a vendor's SDK.
Transports journal nothing and never wait: retries, back-off and the journal belong to the conversation step.
"""

from __future__ import annotations

import email.utils
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol, TypedDict

from workbench.journal.events import Block, ToolUseBlock

if TYPE_CHECKING:
    from workbench.agent.context import Prompt


class Usage(TypedDict, total=False):
    """Tokens of one reply, as the journal keeps them (llm.response): input not read from a cache, cache writes
    and reads, and output. A transport maps its API's counts onto these."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int


@dataclass(frozen=True)
class Reply:
    """One complete reply: neutral content blocks (a tool_use whose arguments did not parse carries `malformed`
    and an empty input), why it stopped, the API's ids and the usage."""

    content: list[Block]
    stop_reason: str | None
    id: str | None
    model: str | None
    usage: Usage = field(default_factory=lambda: Usage())


FailureKind = Literal["retryable", "context_length", "fatal"]


class TransportError(Exception):
    """A failed request, classified. str() is one line for the person, never a header (keys travel in them).

    Attributes:
        kind: retryable (overload, rate limit, 5xx, a dropped stream, a network error), context_length (the prompt
            is too long for the model: compact, then try again) or fatal (a rejected key, an unknown model, a bad
            request).
        status: the HTTP status, 200 for an error event inside a stream, 0 when no response came.
        retry_after: seconds the server asked to wait, when it did.
    """

    def __init__(self, message: str, kind: FailureKind, *, status: int = 0, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry_after = retry_after


class BackendError(Exception):
    """The model API cannot be used (no credentials, a rejected key, an unknown model, retries exhausted): one line
    for the person, said before a session is made when it can be, else when the run stops on it."""


class Transport(Protocol):
    """One model API (see the module docstring). A transport is made from an Endpoint (what the person chose with
    --base-url, --price, --no-stream, or what the session journaled); one that takes none ignores it."""

    name: str
    """The API's name for messages ('anthropic')."""
    credential_hint: str
    """What to set when credentials() finds none ('ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) set')."""

    @property
    def base_url(self) -> str:
        """The URL requests go to (from the API's own environment, e.g. ANTHROPIC_BASE_URL); the CLI checks before a
        session is made that its host resolves and accepts connections (backends.reach)."""
        ...

    def credentials(self) -> str | None:
        """The environment variable that holds the credential this transport will use, or None when there is none.

        A transport for a local server that needs no key returns a description of that instead.
        """
        ...

    def check_access(self, model: str) -> str | None:
        """Ask the API about `model` before a session is made.

        Returns:
            None when the credential and model are accepted, else a one-line warning: the check itself could not
            be made (the run may still work), or something to know before a long run (no price for the model).

        Raises:
            BackendError: the credential is rejected or the model is unknown.
        """
        ...

    def request_body(self, prompt: "Prompt", *, model: str, max_tokens: int) -> dict[str, Any]:
        """The exact request for `prompt` (also what `workbench show --prompt-at --json` prints)."""
        ...

    def send(self, body: dict[str, Any]) -> Reply:
        """Send one request and assemble its streamed reply.

        Raises:
            TransportError: the request failed (classified).
        """
        ...

    def cost(self, model: str, usage: Usage) -> tuple[float, bool]:
        """USD for one reply's usage, and whether the model's price is known."""
        ...


class IncompleteStream(Exception):
    """A reply stream ended before the API said it was complete (a proxy or the network dropped it): retried."""


class SdkTransport(ABC):
    """What a transport over a vendor's Python SDK shares (AnthropicTransport, OpenAITransport): the SDK client,
    made on first use with the SDK's own retries off (retries are the conversation step's, so each one is
    journaled), and sending with every failure classified. A subclass makes the client, receives one reply and
    classifies a failure; the rest of the Transport protocol is its own."""

    def __init__(self, client: Any = None, *, timeout: float = 600.0) -> None:
        self._client = client
        """The SDK client (given by tests), else made on first use, so importing a transport never imports its SDK."""
        self.timeout = timeout
        """Seconds one request may take."""

    def client(self, timeout: float | None = None) -> Any:
        """The SDK client; a one-off client with another timeout when asked for one (a given client serves all)."""
        if self._client is None and timeout is not None:
            return self.make_client(timeout)
        if self._client is None:
            self._client = self.make_client(self.timeout)
        return self._client

    @abstractmethod
    def make_client(self, timeout: float) -> Any:
        """A new SDK client with max_retries=0 and this timeout."""

    def send(self, body: dict[str, Any]) -> Reply:
        """Send one request and assemble its reply (receive); a failure that classify() recognises is raised as its
        TransportError instead, without the SDK's exception chained (its text may quote headers); anything else
        propagates as it is.

        Raises:
            TransportError: the request failed (classified).
        """
        try:
            return self.receive(body)
        except Exception as exc:
            failure = self.classify(exc)
            if failure is None:
                raise
            raise failure from None

    @abstractmethod
    def receive(self, body: dict[str, Any]) -> Reply:
        """Send one request and assemble its reply; raises whatever the SDK or the network raised."""

    @abstractmethod
    def classify(self, exc: BaseException) -> TransportError | None:
        """An SDK or network exception as a TransportError; None for anything that is not a failed request."""


def lost_reply(exc: BaseException, connection_error: type[BaseException],
               short: Callable[[BaseException], str]) -> TransportError | None:
    """`exc` as a retryable failure when no whole reply came: the SDK's `connection_error`, a stream that ended early
    (IncompleteStream) or a network error the SDK's HTTP library let through; None for anything else.

    Args:
        exc: what the request raised.
        connection_error: the SDK's class for a request that got no response (APIConnectionError).
        short: the transport's one line about a failure (never a header).
    """
    if isinstance(exc, (connection_error, IncompleteStream, *network_errors())):
        return TransportError(short(exc), "retryable", status=0, retry_after=retry_after(exc))
    return None


def tool_use(id: str, name: str, raw: str) -> ToolUseBlock:
    """A tool_use block from streamed argument JSON; arguments that are not a JSON object leave `input` empty and
    say why in `malformed`, so one bad call becomes a tool error for that call instead of losing the whole reply."""
    try:
        value = json.loads(raw) if raw.strip() else {}
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, got {type(value).__name__}")
    except ValueError as exc:
        return {"type": "tool_use", "id": id, "name": name, "input": {},
                "malformed": f"{str(exc).splitlines()[0][:120]}; got {raw[:200]!r}"}
    return {"type": "tool_use", "id": id, "name": name, "input": value}


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server that raised `exc` (an SDK's status or connection error) asked us to wait: its response's
    retry-after-ms, or retry-after in seconds or as an HTTP date."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
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


def network_errors() -> tuple[type[BaseException], ...]:
    """Network errors an SDK lets through while a stream is read (its HTTP library's own classes)."""
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

