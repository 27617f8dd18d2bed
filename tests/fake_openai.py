"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1 that the real `openai` client talks to.

It speaks what vLLM, SGLang and OpenAI serve: POST /v1/chat/completions as server-sent events (chunks with text
and tool-call deltas, a finish_reason, a usage chunk when stream_options asks for one, then [DONE]) or as one
JSON reply, JSON error bodies with retry-after headers, and GET /v1/models. Like a strict server it checks each
request (a system message first, every tool call answered by a tool message right after the reply that made it)
and refuses a broken one with a 400. A script decides each reply: a message (text and tool calls, optionally with
malformed argument JSON, without ids, or with the name repeated in every chunk), an HTTP error, an error event
mid-stream, a stream that ends before its finish_reason, or a connection cut mid-stream. Every request body is
recorded for assertions; the key is checked, never stored, and a wrong one is echoed back in the 401 as OpenAI
does, so tests can see that the client never shows it.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

KEY = "sk-proj-test-4b1d9e7c2a5f8e3d6c9b0a1f2e3d4c5b"
"""The key the fake accepts when it wants one; tests scan a run's files and output for it."""
MODEL = "qwen3-coder-test"
"""The one model the fake serves unless told otherwise."""

NO_TOOLS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
"""What vLLM answers a request with tools when it was started without tool parsing."""


@dataclass
class Call:
    """A tool call in a reply; `raw` sends that exact argument text (which may be malformed) instead of `args`."""

    id: str
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    raw: str | None = None

    @property
    def arguments(self) -> str:
        return self.raw if self.raw is not None else json.dumps(self.args)


@dataclass
class Reply:
    """A successful reply: text and tool calls."""

    text: str = ""
    calls: list[Call] = field(default_factory=list)
    finish: str | None = None
    """Default: tool_calls when there are calls, else stop."""
    usage: dict[str, int] | None = None
    """Replaces the usage the fake computes."""
    ids: bool = True
    """False: the tool calls carry no ids (as some small servers send them)."""
    repeat_names: bool = False
    """True: every argument chunk repeats the call's id and name (as some gateways do)."""


@dataclass
class Status:
    """An HTTP error with an OpenAI-style JSON body."""

    status: int
    message: str = "scripted error"
    type: str = "server_error"
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class StreamError:
    """A 200 stream that sends an error event after its first chunk (a server failing mid-reply)."""

    message: str = "the engine is overloaded"


@dataclass
class Drop:
    """A reply whose connection is cut after `after` events, without ending the chunked body."""

    reply: Reply
    after: int = 3


@dataclass
class Unfinished:
    """A stream that ends cleanly after `after` events but before its finish_reason (a proxy that gave up)."""

    reply: Reply
    after: int = 3


def text_of(message: dict[str, Any]) -> str:
    """A chat message's text, whether its content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def all_text(body: dict[str, Any]) -> str:
    """Everything a request lets the model read: system, user, tool results, and its own earlier calls."""
    parts = []
    for message in body.get("messages", []):
        parts.append(text_of(message))
        for call in message.get("tool_calls") or []:
            parts.append(call["function"]["arguments"])
    return "\n".join(parts)


def problems(body: dict[str, Any]) -> list[str]:
    """What a strict chat-completions server refuses in a request (empty when it is well formed)."""
    out = []
    messages = body.get("messages") or []
    if not messages or messages[0].get("role") != "system":
        out.append("messages[0] must be the system message")
    open_calls: set[str] = set()
    answered: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            out.append(f"messages[{i}]: unknown role {role!r}")
        if role == "tool":
            if message.get("tool_call_id") not in open_calls:
                out.append(f"messages[{i}]: tool message for {message.get('tool_call_id')!r}, which the preceding "
                           "assistant message did not call")
            answered.add(message.get("tool_call_id"))
            continue
        if open_calls - answered:
            out.append(f"messages[{i}]: an assistant message with 'tool_calls' must be followed by tool messages "
                       f"responding to each 'tool_call_id' (missing {sorted(open_calls - answered)})")
        open_calls, answered = set(), set()
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                open_calls.add(call["id"])
                try:
                    json.loads(call["function"]["arguments"])
                except ValueError:
                    out.append(f"messages[{i}]: tool call {call['id']} arguments are not JSON")
            if not message.get("tool_calls") and message.get("content") is None:
                out.append(f"messages[{i}]: an assistant message needs content or tool_calls")
        elif role == "user" and not text_of(message):
            out.append(f"messages[{i}]: empty user message")
    if open_calls - answered:
        out.append("the last assistant message's tool calls are not answered")
    if body.get("tools") and body.get("tool_choice") not in (None, "auto", "required"):
        out.append(f"unsupported tool_choice {body.get('tool_choice')!r}")
    if "stream_options" in body and not body.get("stream"):
        out.append("stream_options is only allowed when stream is true")
    return out


def _chunks(reply: Reply, model: str, usage: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The stream of one reply, as OpenAI sends it: role, text pieces, tool-call deltas, finish, usage."""
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    words = reply.text.split(" ") if reply.text else []
    for j in range(0, len(words), 4):
        out.append(chunk({"content": " ".join(words[j:j + 4]) + (" " if j + 4 < len(words) else "")}))
    for i, call in enumerate(reply.calls):
        head = {"index": i, "type": "function", "function": {"name": call.name, "arguments": ""}}
        if reply.ids:
            head["id"] = call.id
        out.append(chunk({"tool_calls": [head]}))
        raw = call.arguments
        for j in range(0, len(raw), 40):
            piece: dict[str, Any] = {"index": i, "function": {"arguments": raw[j:j + 40]}}
            if reply.repeat_names:
                piece["function"]["name"] = call.name
                if reply.ids:
                    piece["id"] = call.id
            out.append(chunk({"tool_calls": [piece]}))
    out.append(chunk({}, reply.finish or ("tool_calls" if reply.calls else "stop")))
    if usage is not None:
        out.append({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
                    "choices": [], "usage": usage})
    return out


def _whole(reply: Reply, model: str, usage: dict[str, Any]) -> dict[str, Any]:
    """One reply as a non-streamed chat.completion."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.calls:
        message["tool_calls"] = [{**({"id": c.id} if reply.ids else {}), "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in reply.calls]
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": reply.finish or ("tool_calls" if reply.calls else "stop")}],
            "usage": usage}


class FakeOpenAI:
    """The server. `script(body, index)` returns the reply for the index-th chat-completions request.

    Args:
        script: a function of (request body, request index), or a list of replies used in order (the last one
            repeats).
        on_request: called with (body, index) before the reply is chosen, in the handler thread; a test may
            block in it (e.g. to kill the client while its request is in flight).
        key: the bearer token the server wants; None: any or none (a local server).
        models: what GET /v1/models lists; a request for any other model is a 404.
        tools: False: refuse requests with tools, as vLLM does without --enable-auto-tool-choice.
    """

    def __init__(self, script: Callable[[dict[str, Any], int], Any] | list[Any],
                 on_request: Callable[[dict[str, Any], int], None] | None = None, *, key: str | None = KEY,
                 models: tuple[str, ...] = (MODEL,), tools: bool = True) -> None:
        self.script = script
        self.on_request = on_request
        self.key = key
        self.models = models
        self.tools = tools
        self.requests: list[dict[str, Any]] = []
        """Every well-formed chat-completions body received, in arrival order."""
        self.refused: list[list[str]] = []
        """What was wrong with each malformed request (a client bug if any)."""
        self.tokens: list[str] = []
        """The bearer token of every request (to check what a keyless client sends)."""
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        """What --base-url must be."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> "FakeOpenAI":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            """One request: the model list or a scripted chat completion."""

            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                """Quiet: test output is for assertions."""

            def do_GET(self) -> None:
                """GET /v1/models (as vLLM lists it, with its context length)."""
                if not self._authorised():
                    return
                if self.path.rstrip("/") == "/v1/models":
                    return self._json(200, {"object": "list", "data": [
                        {"id": m, "object": "model", "created": 0, "owned_by": "fake", "max_model_len": 32768}
                        for m in fake.models]})
                self._error(404, f"no route {self.path}", "not_found")

            def do_POST(self) -> None:
                """A chat completion: check and record the body, then play the script's reply."""
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self._authorised():
                    return
                if self.path != "/v1/chat/completions":
                    return self._error(404, f"no route {self.path}", "not_found")
                if body.get("model") not in fake.models:
                    return self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError",
                                       code="model_not_found")
                wrong = problems(body)
                if wrong:
                    fake.refused.append(wrong)
                    return self._error(400, "; ".join(wrong), "invalid_request_error")
                if body.get("tools") and not fake.tools:
                    return self._error(400, NO_TOOLS, "BadRequestError")
                with fake._lock:
                    index = len(fake.requests)
                    fake.requests.append(body)
                if fake.on_request is not None:
                    fake.on_request(body, index)
                reply = fake._reply(body, index)
                if isinstance(reply, Status):
                    return self._error(reply.status, reply.message, reply.type, reply.headers, reply.code)
                if not body.get("stream"):
                    return self._json(200, _whole(reply, body["model"], fake.usage(body)))
                self._stream(body, reply)

            def _authorised(self) -> bool:
                given = (self.headers.get("authorization") or "").removeprefix("Bearer ")
                fake.tokens.append(given)
                if fake.key is None or given == fake.key:
                    return True
                # OpenAI echoes (part of) the key it refused; a client must never show it.
                self._error(401, f"Incorrect API key provided: {given}.", "invalid_request_error",
                            code="invalid_api_key")
                return False

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

            def _error(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None,
                       code: str | None = None) -> None:
                self._json(status, {"error": {"message": message, "type": kind, "param": None, "code": code}},
                           headers)

            def _send(self, payload: Any) -> None:
                data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _stream(self, body: dict[str, Any], reply: Any) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                usage = fake.usage(body) if (body.get("stream_options") or {}).get("include_usage") else None
                if isinstance(reply, StreamError):
                    self._send(_chunks(Reply("x"), body["model"], None)[0])
                    self._send({"error": {"message": reply.message, "type": "server_error", "code": 500}})
                    self.wfile.write(b"0\r\n\r\n")
                    return
                message = reply.reply if isinstance(reply, (Drop, Unfinished)) else reply
                if message.usage is not None and usage is not None:
                    usage = {**usage, **message.usage}
                chunks = _chunks(message, body["model"], usage)
                for i, chunk in enumerate(chunks):
                    if isinstance(reply, Drop) and i == reply.after:
                        self.connection.shutdown(socket.SHUT_RDWR)  # the peer vanishes mid-body
                        return
                    if isinstance(reply, Unfinished) and i == reply.after:
                        break
                    self._send(chunk)
                else:
                    self._send("[DONE]")
                self.wfile.write(b"0\r\n\r\n")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A client killed mid-reply leaves a broken pipe behind; that is the point of those tests, not an error.
        self._server.handle_error = lambda request, address: None  # type: ignore[method-assign]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _reply(self, body: dict[str, Any], index: int) -> Any:
        if callable(self.script):
            return self.script(body, index)
        return self.script[min(index, len(self.script) - 1)]

    @staticmethod
    def usage(body: dict[str, Any]) -> dict[str, Any]:
        """Token counts the fake reports: about 4 characters a token, the system prompt and tools read from a
        prefix cache (as vLLM reports cached_tokens with prefix caching on)."""
        messages = body.get("messages", [])
        prefix = (len(json.dumps(messages[:1])) + len(json.dumps(body.get("tools", [])))) // 4
        total = prefix + len(json.dumps(messages[1:])) // 4
        return {"prompt_tokens": total, "completion_tokens": 30, "total_tokens": total + 30,
                "prompt_tokens_details": {"cached_tokens": prefix}}
