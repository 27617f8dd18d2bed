"""SdkTransport and lost_reply: what the claude and openai transports share, without either SDK."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from workbench.agent.backends.transport import (
    IncompleteStream,
    Reply,
    SdkTransport,
    TransportError,
    lost_reply,
)


class Refused(Exception):
    """Stands for an SDK's connection error."""


class Toy(SdkTransport):
    """An SDK transport whose client is a label and whose reply is whatever `raises` says."""

    def __init__(self, client: Any = None, raises: BaseException | None = None) -> None:
        super().__init__(client, timeout=600.0)
        self.made: list[float] = []
        self.raises = raises

    def make_client(self, timeout: float) -> Any:
        self.made.append(timeout)
        return f"client({timeout})"

    def receive(self, body: dict[str, Any]) -> Reply:
        if self.raises is not None:
            raise self.raises
        return Reply([{"type": "text", "text": body["say"]}], "end_turn", "r1", "toy")

    def classify(self, exc: BaseException) -> TransportError | None:
        return lost_reply(exc, Refused, lambda e: f"lost: {e}")


def test_client_is_made_once_and_a_one_off_timeout_is_not_kept():
    toy = Toy()
    assert toy.client(timeout=30.0) == "client(30.0)"
    assert toy.client() == "client(600.0)" and toy.client() == "client(600.0)"
    assert toy.made == [30.0, 600.0]
    assert toy.client(timeout=30.0) == "client(600.0)"  # once made, the session's client serves every call


def test_a_given_client_serves_every_call():
    toy = Toy(client="given")
    assert toy.client() == "given" and toy.client(timeout=30.0) == "given" and toy.made == []


def test_send_raises_the_classified_failure_without_the_sdk_exception():
    with pytest.raises(TransportError) as caught:
        Toy(raises=Refused("connection refused")).send({})
    failure = caught.value
    assert (failure.kind, failure.status, str(failure)) == ("retryable", 0, "lost: connection refused")
    assert failure.__suppress_context__ and failure.__cause__ is None  # the SDK's text may quote headers


def test_send_passes_a_reply_and_an_unclassified_exception_through():
    assert Toy().send({"say": "hi"}).content == [{"type": "text", "text": "hi"}]
    with pytest.raises(KeyError):
        Toy(raises=KeyError("not a failed request")).send({})


def test_lost_reply_retries_a_dropped_stream_after_the_wait_the_server_asked_for():
    dropped = IncompleteStream("ended early")
    dropped.response = SimpleNamespace(headers={"retry-after": "7"})  # type: ignore[attr-defined]
    failure = lost_reply(dropped, Refused, str)
    assert failure is not None and (failure.kind, failure.retry_after) == ("retryable", 7.0)
    assert lost_reply(ValueError("a bug"), Refused, str) is None
