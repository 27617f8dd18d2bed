"""A scripted Messages API on 127.0.0.1 that the real `anthropic` client talks to through base_url.

It speaks the wire format the SDK reads: SSE streams (message_start, content_block_*, message_delta,
message_stop, ping and error events) over chunked HTTP/1.1, JSON error bodies with retry-after headers, and
GET /v1/models/{id} for the pre-run key check. A script decides each reply: a message (text and tool_use
blocks, optionally with malformed argument JSON), an HTTP error, an error event mid-stream, or a connection
dropped mid-stream. The server can also go away (its port then refuses connections) and come back on the same
port, as an API behind a network outage does. Every request body is recorded for assertions; credentials are
checked, never stored.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

KEY = "sk-ant-test-7f3c9b1e5d2a4c6e8f0a1b3c5d7e9f10"
"""The key the fake accepts; tests scan a run's files for it."""


@dataclass
class Message:
    """A successful streamed reply."""

    blocks: list[dict[str, Any]]
    stop_reason: str | None = None
    usage: dict[str, int] | None = None


@dataclass
class Status:
    """An HTTP error reply (429, 529, 500, 401, ...) with a JSON error body."""

    status: int
    error_type: str
    message: str = "scripted error"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class StreamError:
    """A 200 stream that reports an error event after message_start (as the API does when it overloads mid-reply)."""

    error_type: str = "overloaded_error"


@dataclass
class Drop:
    """A reply whose connection is cut after `after` SSE events, without ending the chunked body."""

    reply: Message
    after: int = 3


def text(value: str) -> dict[str, Any]:
    """A text block."""
    return {"type": "text", "text": value}


def tool_use(id: str, name: str, input: dict[str, Any] | None = None, raw: str | None = None) -> dict[str, Any]:
    """A tool_use block; `raw` sends that exact argument JSON (which may be malformed) instead of `input`."""
    return {"type": "tool_use", "id": id, "name": name, "input": input or {}, "raw": raw}


def _events(reply: Message, model: str, usage: dict[str, int]) -> list[tuple[str, dict[str, Any]]]:
    tool = any(b["type"] == "tool_use" for b in reply.blocks)
    out: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": {
        "id": "msg_fake", "type": "message", "role": "assistant", "content": [], "model": model,
        "stop_reason": None, "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1}}}), ("ping", {"type": "ping"})]
    for i, block in enumerate(reply.blocks):
        if block["type"] == "text":
            out.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                "content_block": {"type": "text", "text": ""}}))
            words = block["text"].split(" ")
            for j in range(0, len(words), 4):
                chunk = " ".join(words[j:j + 4]) + (" " if j + 4 < len(words) else "")
                out.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                     "delta": {"type": "text_delta", "text": chunk}}))
        else:
            out.append(("content_block_start", {"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
            raw = block["raw"] if block.get("raw") is not None else json.dumps(block["input"])
            for j in range(0, len(raw), 40):
                out.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                     "delta": {"type": "input_json_delta",
                                                               "partial_json": raw[j:j + 40]}}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    out.append(("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": reply.stop_reason or ("tool_use" if tool else "end_turn"),
                                            "stop_sequence": None},
                                  "usage": {"output_tokens": 20 + 10 * len(reply.blocks)}}))
    out.append(("message_stop", {"type": "message_stop"}))
    return out


class FakeAnthropic:
    """The server. `script(body, index)` returns the reply for the index-th /v1/messages request.

    Args:
        script: a function of (request body, request index), or a list of replies used in order (the last one
            repeats).
        on_request: called with (body, index) before the reply is chosen, in the handler thread; a test may
            block in it (e.g. to kill the client while its request is in flight).
    """

    def __init__(self, script: Callable[[dict[str, Any], int], Any] | list[Any],
                 on_request: Callable[[dict[str, Any], int], None] | None = None, key: str = KEY) -> None:
        self.script = script
        self.on_request = on_request
        self.key = key
        self.requests: list[dict[str, Any]] = []
        """Every /v1/messages body received, in arrival order."""
        self.model_checks: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._handler: type[BaseHTTPRequestHandler] | None = None
        self._port = 0

    @property
    def base_url(self) -> str:
        """What the client's base_url (or ANTHROPIC_BASE_URL) must be (the same while the server is away)."""
        assert self._port
        return f"http://127.0.0.1:{self._port}"

    def __enter__(self) -> "FakeAnthropic":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            """One request: the model check (GET /v1/models/ID) or a scripted /v1/messages reply."""

            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                """Quiet: test output is for assertions."""

            def do_GET(self) -> None:
                """The pre-run key and model check."""
                if not fake._authorised(self.headers):
                    return self._error(401, "authentication_error", "invalid x-api-key")
                if self.path.startswith("/v1/models/"):
                    model = self.path.rsplit("/", 1)[1]
                    fake.model_checks.append(model)
                    if model.startswith("nope"):
                        return self._error(404, "not_found_error", f"model: {model}")
                    return self._json(200, {"type": "model", "id": model, "display_name": model,
                                            "created_at": "2025-01-01T00:00:00Z", "lifecycle": "active"})
                self._error(404, "not_found_error", self.path)

            def do_POST(self) -> None:
                """A Messages API call: record the body, then play the script's reply."""
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not fake._authorised(self.headers):
                    return self._error(401, "authentication_error", "invalid x-api-key")
                if self.path != "/v1/messages":
                    return self._error(404, "not_found_error", self.path)
                with fake._lock:
                    index = len(fake.requests)
                    fake.requests.append(body)
                if fake.on_request is not None:
                    fake.on_request(body, index)
                reply = fake._reply(body, index)
                if isinstance(reply, Status):
                    return self._error(reply.status, reply.error_type, reply.message, reply.headers)
                self._stream(body, reply)

            def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.send_header("connection", "close")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = True

            def _error(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
                self._json(status, {"type": "error", "error": {"type": kind, "message": message}}, headers)

            def _chunk(self, event: str, payload: dict[str, Any]) -> None:
                data = f"event: {event}\ndata: {json.dumps(payload)}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _stream(self, body: dict[str, Any], reply: Any) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                usage = fake.usage(body)
                if isinstance(reply, StreamError):
                    self._chunk("message_start", _events(Message([text("x")]), body["model"], usage)[0][1])
                    self._chunk("error", {"type": "error", "error": {"type": reply.error_type,
                                                                     "message": "Overloaded"}})
                    self.wfile.write(b"0\r\n\r\n")
                    return
                message = reply.reply if isinstance(reply, Drop) else reply
                events = _events(message, body["model"], {**usage, **(message.usage or {})})
                for i, (event, payload) in enumerate(events):
                    if isinstance(reply, Drop) and i == reply.after:
                        # Cut the TCP stream mid-body: the client sees a peer that vanished.
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self._chunk(event, payload)
                self.wfile.write(b"0\r\n\r\n")

        self._handler = Handler
        self._listen()
        return self

    def _listen(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), self._handler)  # type: ignore[arg-type]
        self._port = self._server.server_address[1]
        self._server.daemon_threads = True
        # A client killed mid-reply leaves a broken pipe behind; that is the point of those tests, not an error.
        self._server.handle_error = lambda request, address: None  # type: ignore[method-assign]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def go_away(self) -> None:
        """Stop listening: connections to the port are refused until come_back(). From a request's handler (on_request)
        the reply in progress is still sent: only the next connection is refused."""
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def come_back(self) -> None:
        """Listen again on the same port (base_url is unchanged)."""
        with self._lock:
            if self._server is None:
                self._listen()

    def __exit__(self, *exc: Any) -> None:
        self.go_away()

    def _authorised(self, headers: Any) -> bool:
        given = headers.get("x-api-key") or (headers.get("authorization") or "").removeprefix("Bearer ")
        return given == self.key

    def _reply(self, body: dict[str, Any], index: int) -> Any:
        if callable(self.script):
            return self.script(body, index)
        return self.script[min(index, len(self.script) - 1)]

    @staticmethod
    def usage(body: dict[str, Any]) -> dict[str, int]:
        """Token counts the fake reports: about 4 characters a token, the cached prefix read from the cache."""
        prefix = len(json.dumps(body.get("system", ""))) + len(json.dumps(body.get("tools", [])))
        messages = len(json.dumps(body.get("messages", [])))
        return {"input_tokens": messages // 4, "cache_read_input_tokens": prefix // 4,
                "cache_creation_input_tokens": 0}


def all_text(body: dict[str, Any]) -> str:
    """Every piece of text a request carries (system, messages, tool results): what the model could read."""
    parts = [b.get("text", "") for b in body.get("system", [])]

    def walk(blocks: list[dict[str, Any]]) -> None:
        """Collect text from blocks, descending into tool results."""
        for block in blocks:
            if block.get("type") == "text":
                parts.append(block["text"])
            elif block.get("type") == "tool_result":
                walk(block.get("content", []))
            elif block.get("type") == "tool_use":
                parts.append(json.dumps(block.get("input", {})))

    for message in body.get("messages", []):
        walk(message["content"] if isinstance(message["content"], list) else [text(message["content"])])
    return "\n".join(parts)


def plain(value: Any) -> Any:
    """A request part without cache breakpoints (they move every turn by design)."""
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        value.pop("cache_control", None)
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
