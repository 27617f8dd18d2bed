"""The Transport protocol: what a model API must provide to the vendor-neutral conversation step.

A transport turns the neutral prompt (system text, tool specs, messages of neutral content blocks: text, tool_use
with id/name/input, tool_result) into its API's request, streams one reply back as neutral blocks with neutral
usage, classifies its failures, prices usage, and checks credentials and access before a session is made. The
Anthropic Messages API is one implementation (backends/claude.py); an OpenAI-compatible chat-completions API is
meant to be the second (issue #20). Transports journal nothing and never wait: retries, back-off and the journal
belong to the conversation step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict

from workbench.journal.events import Block

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
    """One model API (see the module docstring)."""

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
            None when the credential and model are accepted, else a warning when the check itself could not be
            made (the run may still work).

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
