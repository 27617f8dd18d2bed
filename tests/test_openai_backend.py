"""The openai backend with the real `openai` client against the local stand-in server (no network)."""

import json
import socket
import threading
from pathlib import Path

import pytest

pytest.importorskip("openai")

from fake_openai import (  # noqa: E402
    KEY, MODEL, Call, Drop, FakeOpenAI, Reply, Status, StreamError, Unfinished, all_text, text_of)
from workbench.agent.backends.conversation import ConversationBackend, RetryPolicy  # noqa: E402
from workbench.agent.backends.openai_chat import OpenAITransport, chat_messages, classify  # noqa: E402
from workbench.agent.backends.transport import BackendError  # noqa: E402
from workbench.agent.budget import Budget  # noqa: E402
from workbench.agent.context import context_at  # noqa: E402
from workbench.agent.evaluation import FunctionEvaluator  # noqa: E402
from workbench.agent.prompts import goal_text  # noqa: E402
from workbench.agent.runtime import AgentRuntime  # noqa: E402
from workbench.agent.tools import TOOLS  # noqa: E402
from workbench.session import SessionStore  # noqa: E402
from workbench.session.state import SessionState  # noqa: E402
from workbench.tasks import load_task  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tasks"
PRICE = [0.5, 2.0, 0.05]


@pytest.fixture(scope="module")
def task():
    return load_task("tiny", root=FIXTURES)


@pytest.fixture(autouse=True)
def no_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def fake_eval(task, path, device, **kw):
    ok = "BROKEN" not in Path(path).read_text()
    return {"verdict": "ok" if ok else "incorrect", "message": "" if ok else "C1 rel_err 1 > 1e-06",
            "speedup": 1.5 if ok else None, "timing_comparable": False,
            "shapes": [{"name": "C1", "correct": ok, "ms": 0.1, "speedup": 1.5 if ok else None}]}


def transport(server, **endpoint):
    return OpenAITransport({"base_url": server.base_url, **endpoint})


def start(tmp_path, server, task, budget=Budget(), max_retries=8, **endpoint):
    chat = transport(server, **endpoint)
    backend = ConversationBackend("openai", chat, MODEL, seed_source=task.seed.read_text(), endpoint=chat.endpoint,
                                  retry=RetryPolicy(max_retries=max_retries, backoff_base=0.01))
    files = SessionStore(tmp_path).create(task="tiny", agent="openai", model=MODEL, device="cpu", budget={})
    rt = AgentRuntime(files, SessionState(), task, backend, device="cpu", budget=budget,
                      evaluator=FunctionEvaluator(fake_eval))
    rt.emit("session.created", {"id": files.id, "task": "tiny", "agent": "openai", "device": "cpu", "budget": {},
                                "endpoint": chat.endpoint})
    rt.emit("goal.set", {**task.public_view(), "device": "cpu", "budget": budget.to_dict()})
    return rt, files


def journal(files, kind=None):
    return [e for e in files.read_events() if kind is None or e.type == kind]


CONVERSATION = [
    Reply("Reading first.", [Call("c1", "read_task"), Call("c2", "read_kernel")]),
    Reply(calls=[Call("c3", "ledger", {"action": "add", "strategy": "add instead of multiply"}),
                 Call("c4", "edit_kernel", {"search": "x * 2.0, mask", "replace": "x + x, mask", "strategy": "S1",
                                            "note": "x + x"})]),
    Reply("Now measure it.", [Call("c5", "evaluate", {}), Call("c6", "read_kernel", {"attempt": 2})]),
    Reply(calls=[Call("c7", "finish", {"reason": "done"})]),
]


@pytest.mark.parametrize("stream", [True, False])
def test_replies_with_several_tool_calls_run_in_order_and_the_context_is_rebuilt_from_the_journal(
        tmp_path, task, stream):
    with FakeOpenAI(CONVERSATION, key=None) as server:
        rt, files = start(tmp_path, server, task, price=PRICE, stream=stream)
        assert rt.run(threading.Event()) == "the model finished: done"
    bodies = server.requests
    assert len(bodies) == 4 and server.refused == [] and rt.state.status == "finished"
    calls = [e.data for e in journal(files, "tool.call")]
    assert [c["tool"] for c in calls] == ["read_task", "read_kernel", "ledger", "edit_kernel", "evaluate",
                                          "read_kernel", "finish"]
    assert [c["ref"] for c in calls] == [f"c{i}" for i in range(1, 8)]
    for i, body in enumerate(bodies):
        assert body["model"] == MODEL and body["stream"] is stream and body["tool_choice"] == "auto"
        assert ("stream_options" in body) is stream and body["max_tokens"] == 8192
        assert [t["function"]["name"] for t in body["tools"]] == list(TOOLS)
        assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in body["tools"])
        system = body["messages"][0]
        assert system["role"] == "system" and goal_text(rt.state.goal) in system["content"]
        if i:  # the history is re-sent unchanged (a prefix cache can keep it): each request adds its delta only
            previous = bodies[i - 1]["messages"]
            assert body["messages"][:len(previous)] == previous
            added = [m["role"] for m in body["messages"][len(previous):]]
            assert added == ["assistant", "tool", "tool", "user"]
    # the tool results: the goal, the seed source, the evaluation report; the source of attempt 2 (the edit; attempt 1
    # is the starting kernel) as text
    assert "rel_rms <= 1e-06" in all_text(bodies[1]) and "def forward(x: torch.Tensor)" in all_text(bodies[1])
    assert "verdict: ok" in all_text(bodies[3]) and "speedup (geomean): 1.5x" in all_text(bodies[3])
    assert "tl.store(y_ptr + offs, x + x, mask=mask)" in all_text(bodies[3])
    # usage: prompt tokens a prefix cache served are kept apart, and priced as the person said
    responses = [e.data for e in journal(files, "llm.response")]
    for response, body in zip(responses, bodies):
        reported = FakeOpenAI.usage(body)
        assert response["input_tokens"] + response["cache_read_input_tokens"] == reported["prompt_tokens"]
        assert response["cache_read_input_tokens"] == reported["prompt_tokens_details"]["cached_tokens"] > 0
        assert response["output_tokens"] == reported["completion_tokens"] and response["priced"]
    expected = sum(r["input_tokens"] * 0.5 + r["cache_read_input_tokens"] * 0.05 + r["output_tokens"] * 2.0
                   for r in responses) / 1e6
    assert rt.state.cost_usd == pytest.approx(expected) and rt.state.cost_usd > 0
    # --prompt-at: the request rebuilt from the journal is the one the server received, byte for byte
    for event, body in zip(journal(files, "llm.request"), bodies):
        prompt, _, _ = context_at(files.read_events(), event.seq + 1)
        assert transport(server, stream=stream).request_body(prompt, model=MODEL, max_tokens=8192) == body
    files.close()


def test_overload_rate_limit_and_broken_streams_are_retried_and_journaled(tmp_path, task):
    script = [
        Status(503, "Service Unavailable"),
        Status(429, "Rate limit reached", "requests", "rate_limit_exceeded", {"retry-after": "0.3"}),
        Drop(Reply("cut short", [Call("t9", "read_task")]), after=3),
        StreamError("the engine died"),
        Unfinished(Reply("no end", [Call("t8", "read_task")]), after=3),
        Status(500, "Internal Server Error", headers={"retry-after-ms": "50"}),
        Reply(calls=[Call("t1", "finish", {"reason": "ok"})]),
    ]
    with FakeOpenAI(script, key=None) as server:
        rt, files = start(tmp_path, server, task)
        rt.run(threading.Event())
    failed = [e for e in journal(files, "llm.response") if not e.data["ok"]]
    assert [e.data["status"] for e in failed] == [503, 429, 0, 200, 0, 500]
    assert "the engine died" in failed[3].data["error"] and "finish_reason" in failed[4].data["error"]
    assert failed[1].data["retry_in"] == 0.3 and failed[1].data["retry_after"]
    assert failed[5].data["retry_in"] == 0.05
    waited = (datetime_of(failed[2]) - datetime_of(failed[1])).total_seconds()
    assert waited >= 0.29, "retry-after was honoured"
    assert [e.data["try"] for e in failed] == [1, 2, 3, 4, 5, 6]
    # the same journaled request was sent seven times, unchanged, and the run went on
    assert len(server.requests) == 7 and all(b == server.requests[0] for b in server.requests)
    assert len(journal(files, "llm.request")) == 1 and rt.state.status == "finished"
    files.close()


def datetime_of(event):
    from workbench.session.state import parse_ts

    return parse_ts(event.ts)


def test_malformed_arguments_are_tool_errors_and_calls_without_ids_still_run(tmp_path, task):
    script = [
        Reply(calls=[Call("t1", "edit_kernel", raw='{"search": "x", "replace": '),
                     Call("t2", "read_kernel", {"attempt": "two"}),
                     Call("t3", "rm_rf", {"path": "/"}),
                     Call("t4", "read_kernel", raw="[1, 2]"),
                     Call("t5", "read_kernel", raw="")]),
        Reply(calls=[Call("", "read_task"), Call("", "read_kernel")], ids=False),
        Reply(calls=[Call("dup", "list_attempts"), Call("dup", "show_best")]),
        Reply(calls=[Call("r1", "read_file", {"path": "reference.py"})], repeat_names=True),
        Reply(""),  # an empty reply: no text, no call
        Reply(calls=[Call("t6", "finish", {"reason": "done"})]),
    ]
    with FakeOpenAI(script, key=None) as server:
        rt, files = start(tmp_path, server, task)
        assert rt.run(threading.Event()) == "the model finished: done"
    assert server.refused == []
    results = [m for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == ["t1", "t2", "t3", "t4", "t5"]
    texts = [m["content"] for m in results]
    assert texts[0].startswith("error: your arguments for edit_kernel were not valid JSON") and "call it again" in texts[0]
    assert "attempt must be integer" in texts[1] and "unknown tool 'rm_rf'" in texts[2]
    assert "expected an object" in texts[3] and not texts[4].startswith("error")  # empty arguments: {}
    # the reply goes back with the malformed call's arguments emptied (the API needs JSON there)
    sent = server.requests[1]["messages"][2]["tool_calls"]
    assert [c["function"]["arguments"] for c in sent] == ["{}", '{"attempt": "two"}', '{"path": "/"}', "{}", "{}"]
    # calls that came without ids got ids of their own, distinct, and each was answered
    second = server.requests[2]["messages"]
    ids = [c["id"] for c in second[-4]["tool_calls"]]
    assert len(set(ids)) == 2 and all(ids) and [m["tool_call_id"] for m in second[-3:-1]] == ids
    # so did two calls that came with the same id
    third = server.requests[3]["messages"]
    ids = [c["id"] for c in third[-4]["tool_calls"]]
    assert ids[0] == "dup" and len(set(ids)) == 2 and [m["tool_call_id"] for m in third[-3:-1]] == ids
    # a name repeated in every chunk is still one name
    assert [c["function"]["name"] for c in server.requests[4]["messages"][-3]["tool_calls"]] == ["read_file"]
    assert "def make_inputs" in server.requests[4]["messages"][-2]["content"]
    # an empty reply goes back as empty text, and the model is told to call a tool
    assert server.requests[5]["messages"][-2] == {"role": "assistant", "content": ""}
    assert "You replied without calling a tool" in server.requests[5]["messages"][-1]["content"]
    files.close()


def test_a_prompt_too_long_for_the_model_is_compacted_and_sent_once_more_then_stops(tmp_path, task):
    too_long = Status(400, "This model's maximum context length is 32768 tokens. However, you requested 40123 "
                           "tokens (31931 in the messages, 8192 in the completion).", "BadRequestError")
    script = [
        Reply(calls=[Call("t1", "read_task")]),
        Reply(calls=[Call("t2", "read_kernel")]),
        Reply(calls=[Call("t3", "read_file", {"path": "reference.py"})]),
        too_long,
        Reply(calls=[Call("t4", "read_kernel")]),
        too_long,
        too_long,
    ]
    with FakeOpenAI(script, key=None) as server:
        rt, files = start(tmp_path, server, task)
        with pytest.raises(BackendError, match="too long even after a compaction"):
            rt.run(threading.Event())
        bodies = list(server.requests)
    kinds = [(e.type, e.data.get("ok")) for e in journal(files) if e.type in ("llm.response", "memory.compacted")]
    assert kinds[3:6] == [("llm.response", False), ("memory.compacted", None), ("llm.response", True)]
    compacted = journal(files, "memory.compacted")[0].data
    assert compacted["limit"] < compacted["tokens_before"] and compacted["tokens_after"] <= compacted["limit"]
    assert len(bodies[4]["messages"]) < len(bodies[3]["messages"])
    assert text_of(bodies[4]["messages"][1]).startswith("MEMORY (compaction #1")
    assert rt.state.status == "stopped" and "too long even after a compaction" in rt.state.stop_reason
    files.close()


def test_a_rejected_key_mid_run_stops_the_run_resumably_without_showing_the_key(tmp_path, task, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with FakeOpenAI([Reply(calls=[Call("t1", "read_task")])]) as server:
        rt, files = start(tmp_path, server, task)
        server.key = "sk-proj-rotated-0000000000000000"  # the key was revoked while the session ran
        with pytest.raises(BackendError, match=r"rejected the key \(401\): check OPENAI_API_KEY"):
            rt.run(threading.Event())
    assert server.tokens == [KEY] and rt.state.status == "stopped"
    assert KEY not in (Path(files.dir) / "events.jsonl").read_text()
    files.close()


def probe(server, **endpoint):
    return transport(server, **endpoint).check_access(MODEL)


def test_the_pre_run_check_says_what_cannot_work_in_one_line(monkeypatch):
    with FakeOpenAI([Reply(calls=[Call("p", "read_task")])], key=None) as server:
        assert probe(server, price=[1, 2]) is None
        assert "no price is known for model" in probe(server)
        body = server.requests[0]
        assert [t["function"]["name"] for t in body["tools"]] == list(TOOLS) and body["stream"] is False
        server.script = [Reply("pong")]
        assert "answered a request to call a tool without calling one" in probe(server, price=[1, 2])
        server.script = [Reply("Let me think about", finish="length")]
        assert "token limit" in probe(server, price=[1, 2])
        server.script = [Reply('[TOOL_CALLS] [{"name": "read_task", "arguments": {}}]')]
        with pytest.raises(BackendError, match="wrote its tool call as text"):
            probe(server)
        server.script = [Status(503, "loading")]
        assert "could not check the server before starting (503" in probe(server, price=[1, 2])
        server.script = [Status(429, "You exceeded your current quota", "insufficient_quota", "insufficient_quota")]
        with pytest.raises(BackendError, match="out of quota"):
            probe(server)
        server.script = [Status(400, "registry.ollama.ai/library/gemma:2b does not support tools")]
        with pytest.raises(BackendError, match="cannot call tools with model .* does not support tools"):
            probe(server)
    with FakeOpenAI([], key=None, tools=False) as server:
        with pytest.raises(BackendError, match="--enable-auto-tool-choice"):
            probe(server)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-proj-wrong-1234567890abcdef")
    with FakeOpenAI([]) as server:
        with pytest.raises(BackendError) as refused:
            probe(server)
    assert "rejected the key (401)" in str(refused.value) and "wrong" not in str(refused.value)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BackendError, match=f"cannot reach the model server at http://127.0.0.1:{port}/v1"):
        OpenAITransport({"base_url": f"http://127.0.0.1:{port}/v1"}).check_access(MODEL)
    with FakeOpenAI([], key=None) as server:
        url = server.base_url.removesuffix("/v1")
        with pytest.raises(BackendError, match="has no chat completions API .404.: does the base URL need its /v1"):
            OpenAITransport({"base_url": url}).check_access(MODEL)


def test_the_official_endpoint_needs_a_key_and_takes_max_completion_tokens(monkeypatch):
    official = OpenAITransport()
    assert official.base_url == "https://api.openai.com/v1" and official.credentials() is None
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert official.credentials() == "OPENAI_API_KEY"
    from workbench.agent.context import Prompt

    prompt = Prompt("sys", [], [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], False)
    body = official.request_body(prompt, model="gpt-x", max_tokens=100)
    assert body["max_completion_tokens"] == 100 and "max_tokens" not in body
    monkeypatch.delenv("OPENAI_API_KEY")
    local = OpenAITransport({"base_url": "http://gpu-box:8000/v1/"})
    assert local.base_url == "http://gpu-box:8000/v1" and local.credentials().startswith("none needed")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://gateway:4000/v1")
    assert OpenAITransport().base_url == "http://gateway:4000/v1"
    assert OpenAITransport().endpoint == {"base_url": "http://gateway:4000/v1", "stream": True}
    with pytest.raises(BackendError, match="not an http"):
        OpenAITransport({"base_url": "localhost:8000"})


def test_neutral_messages_become_chat_messages():
    assistant = {"role": "assistant", "content": [
        {"type": "text", "text": "Plan."},
        {"type": "tool_use", "id": "a", "name": "read_kernel", "input": {"attempt": 2}},
        {"type": "tool_use", "id": "b", "name": "edit_kernel", "input": {}, "malformed": "bad"}]}
    assert chat_messages(assistant) == [{"role": "assistant", "content": "Plan.", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "read_kernel", "arguments": '{"attempt": 2}'}},
        {"id": "b", "type": "function", "function": {"name": "edit_kernel", "arguments": "{}"}}]}]
    silent = {"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": "show_best", "input": {}}]}
    assert chat_messages(silent)[0]["content"] is None
    user = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": [{"type": "text", "text": "attempt 2:"},
                                                                {"type": "text", "text": "def forward(): ..."}]},
        {"type": "tool_result", "tool_use_id": "b", "is_error": True,
         "content": [{"type": "text", "text": "error: not JSON"}]},
        {"type": "text", "text": "Message from the person"},
        {"type": "text", "text": "<state>\n</state>"}]}
    assert chat_messages(user) == [
        {"role": "tool", "tool_call_id": "a", "content": "attempt 2:\ndef forward(): ..."},
        {"role": "tool", "tool_call_id": "b", "content": "error: not JSON"},
        {"role": "user", "content": "Message from the person\n\n<state>\n</state>"}]


@pytest.mark.parametrize(("status", "message", "kind"), [
    (400, "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens", "context_length"),
    (400, "The decoder prompt (length 40000) is longer than the maximum model length of 32768.", "context_length"),
    (400, "The input (40000 tokens) is longer than the model's context length (32768 tokens).", "context_length"),
    (400, "the request exceeds the available context size, try increasing it", "context_length"),
    (413, "Request Entity Too Large", "context_length"),
    (400, "'messages' must contain the word 'json'", "fatal"),
    (404, "The model `x` does not exist.", "fatal"),
    (429, "Rate limit reached", "retryable"),
    (502, "Bad Gateway", "retryable"),
])
def test_failures_are_classified_by_status_and_wording(status, message, kind):
    import httpx2
    import openai

    request = httpx2.Request("POST", "http://x/v1/chat/completions")
    response = httpx2.Response(status, request=request, json={"error": {"message": message}})
    exc = openai.APIStatusError(message, response=response, body={"error": {"message": message}})
    failure = classify(exc)
    assert failure.kind == kind and failure.status == status and message[:20] in str(failure)


def test_keys_never_reach_a_message(monkeypatch):
    import httpx2
    import openai

    from workbench.agent.backends.openai_chat import scrub

    monkeypatch.setenv("OPENAI_API_KEY", "abc-secret-token-without-prefix")
    assert scrub("key abc-secret-token-without-prefix and sk-proj-12345678 here") == "key *** and sk-*** here"
    request = httpx2.Request("POST", "http://x/v1/chat/completions")
    body = {"error": {"message": "Incorrect API key provided: abc-secret-token-without-prefix", "code": "x"}}
    exc = openai.APIStatusError("401", response=httpx2.Response(403, request=request, json=body), body=body)
    assert "abc-secret" not in str(classify(exc))


def test_price_as_given():
    chat = OpenAITransport({"base_url": "http://h/v1", "price": [1.0, 4.0]})
    usage = {"input_tokens": 1_000_000, "cache_read_input_tokens": 1_000_000, "output_tokens": 500_000}
    assert chat.cost(MODEL, usage) == (4.0, True)  # cached input at the input price without a third figure
    assert OpenAITransport({"base_url": "http://h/v1", "price": [1.0, 4.0, 0.1]}).cost(MODEL, usage) == (3.1, True)
    assert OpenAITransport({"base_url": "http://h/v1"}).cost(MODEL, usage) == (0.0, False)
    assert json.dumps(chat.endpoint) == '{"base_url": "http://h/v1", "stream": true, "price": [1.0, 4.0]}'
