"""The Claude backend with the real anthropic client against a local fake Messages API (no network)."""

import json
import queue
import re
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

anthropic = pytest.importorskip("anthropic")

from fake_anthropic import (  # noqa: E402
    KEY, Drop, FakeAnthropic, Message, Status, StreamError, all_text, plain, text, tool_use)
from workbench.agent.backends.claude import AnthropicTransport, claude_backend, cost_usd  # noqa: E402
from workbench.agent.backends.conversation import RetryPolicy  # noqa: E402
from workbench.agent.backends.transport import BackendError  # noqa: E402
from workbench.agent.budget import Budget  # noqa: E402
from workbench.agent.commands import Command  # noqa: E402
from workbench.agent.context import context_at  # noqa: E402
from workbench.agent.evaluation import FunctionEvaluator  # noqa: E402
from workbench.agent.prompts import goal_text  # noqa: E402
from workbench.agent.runtime import AgentRuntime  # noqa: E402
from workbench.agent.sink import RecordingSink  # noqa: E402
from workbench.agent.tools import TOOLS  # noqa: E402
from workbench.session import SessionStore  # noqa: E402
from workbench.session.replay import load_state  # noqa: E402
from workbench.session.state import SessionState  # noqa: E402
from workbench.tasks import load_task  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tasks"
MODEL = "claude-sonnet-4-6"


@pytest.fixture(scope="module")
def task():
    return load_task("tiny", root=FIXTURES)


def fake_eval(task, path, device, **kw):
    ok = "BROKEN" not in Path(path).read_text()
    return {"verdict": "ok" if ok else "incorrect", "message": "" if ok else "C1 rel_err 1 > 1e-06",
            "speedup": 1.5 if ok else None, "timing_comparable": False,
            "shapes": [{"name": "C1", "correct": ok, "ms": 0.1, "speedup": 1.5 if ok else None}]}


def backend(server, task, max_retries=8):
    client = anthropic.Anthropic(api_key=KEY, base_url=server.base_url, max_retries=0)
    return claude_backend(MODEL, seed_source=task.seed.read_text(), client=client,
                          retry=RetryPolicy(max_retries=max_retries, backoff_base=0.01))


def start(tmp_path, server, task, budget=Budget(), **kw):
    files = SessionStore(tmp_path).create(task="tiny", agent="claude", model=MODEL, device="cpu", budget={})
    rt = AgentRuntime(files, SessionState(), task, backend(server, task, **kw), device="cpu", budget=budget,
                      evaluator=FunctionEvaluator(fake_eval))
    rt.emit("session.created", {"id": files.id, "task": "tiny", "agent": "claude", "device": "cpu", "budget": {}})
    rt.emit("goal.set", {**task.public_view(), "device": "cpu", "budget": budget.to_dict()})
    return rt, files


def resume(tmp_path, files_id, server, task, budget=Budget(), **kw):
    files = SessionStore(tmp_path).open(files_id, writer=True)
    state = load_state(files)
    return AgentRuntime(files, state, task, backend(server, task, **kw), device="cpu", budget=budget,
                        evaluator=FunctionEvaluator(fake_eval)), files



def journal(files, kind=None):
    return [e for e in files.read_events() if kind is None or e.type == kind]


def last_user_text(body):
    return "\n".join(b.get("text", "") for b in body["messages"][-1]["content"] if b.get("type") == "text")


def reading_script(stop_at):
    """Each request gets one read_kernel call (ids from the tool-call count), then finish."""
    def script(body, index):
        n = int(re.search(r"tool_calls=(\d+)", last_user_text(body)).group(1))
        if n >= stop_at:
            return Message([tool_use(f"t{n}", "finish", {"reason": "enough"})])
        return Message([text(f"step {n}"), tool_use(f"t{n}", "read_kernel", {})])
    return script


def test_multi_turn_tool_use_is_streamed_and_journaled_as_deltas(tmp_path, task):
    script = [
        Message([text("Reading first."), tool_use("t1", "read_task"), tool_use("t2", "read_kernel")]),
        Message([tool_use("t3", "ledger", {"action": "add", "strategy": "add instead of multiply"}),
                 tool_use("t4", "edit_kernel", {"search": "x * 2.0, mask", "replace": "x + x, mask",
                                                "strategy": "S1", "note": "x + x"})]),
        Message([tool_use("t5", "evaluate", {}), tool_use("t7", "read_kernel", {"attempt": 2})]),
        Message([tool_use("t6", "finish", {"reason": "done"})]),
    ]
    with FakeAnthropic(script) as server:
        rt, files = start(tmp_path, server, task)
        assert rt.run(threading.Event()) == "the model finished: done"
    bodies = server.requests
    assert len(bodies) == 4 and rt.state.status == "finished"
    for i, body in enumerate(bodies):
        assert body["model"] == MODEL and body["stream"] is True
        assert [t["name"] for t in body["tools"]] == list(TOOLS)
        assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
        assert "GOAL CONTRACT" in body["system"][0]["text"] and goal_text(rt.state.goal) in body["system"][0]["text"]
        assert len(body["messages"]) == 2 * i + 1 and body["messages"][-1]["content"][-1]["cache_control"]
        breakpoints = json.dumps(body).count("cache_control")
        assert breakpoints <= 4  # the API's limit
        if i:  # the history is re-sent unchanged: each request adds its delta only
            assert plain(body["messages"][:-2]) == plain(bodies[i - 1]["messages"])
    requests = journal(files, "llm.request")
    for event, body in zip(requests, bodies):
        # the pinned prefix is journaled as a hash, never re-stored each turn
        assert len(event.data["delta"]) == 1 and "You are a GPU-kernel engineer" not in json.dumps(event.data)
    # tool results are complete: the goal, the seed source (attempt 1, the starting kernel), the evaluation report
    second = all_text(bodies[1])
    assert "tolerance" not in second or "rel_rms <= 1e-06" in second
    assert "rel_rms <= 1e-06" in second and "def forward(x: torch.Tensor)" in second
    fourth = json.dumps(bodies[3]["messages"][-1])
    assert "verdict: ok" in fourth and "speedup (geomean): 1.5x" in fourth
    # the source of attempt 2 (the edit) travels as a reference in the journal and as text in the request
    assert '"source_of": 2' in json.dumps(requests[3].data["delta"])
    assert '"source_of"' not in json.dumps(bodies) and "tl.store(y_ptr + offs, x + x, mask=mask)" in all_text(bodies[3])
    # tokens and cost per call, summed in the state
    responses = [e.data for e in journal(files, "llm.response")]
    assert rt.state.tokens_in == sum(r["input_tokens"] for r in responses) > 0
    assert rt.state.cost_usd == pytest.approx(sum(cost_usd(MODEL, r) for r in responses))
    assert all(r["cost_usd"] > 0 and r["cache_read_input_tokens"] > 0 for r in responses)
    # --prompt-at: the context rebuilt from the journal is byte-for-byte what was sent
    for event, body in zip(requests, bodies):
        prompt, _, _ = context_at(files.read_events(), event.seq + 1)
        rebuilt = AnthropicTransport().request_body(prompt, model=MODEL, max_tokens=8192)
        for key in ("system", "tools", "messages", "model", "max_tokens"):
            assert rebuilt[key] == body[key]
    files.close()


def test_overload_rate_limit_and_dropped_streams_are_retried_and_journaled(tmp_path, task):
    script = [
        Status(529, "overloaded_error", "Overloaded"),
        Status(429, "rate_limit_error", "slow down", headers={"retry-after": "0.3"}),
        Drop(Message([text("cut short"), tool_use("t9", "read_task")]), after=4),
        StreamError("overloaded_error"),
        Status(503, "api_error", headers={"retry-after-ms": "50"}),
        Message([tool_use("t1", "finish", {"reason": "ok"})]),
    ]
    with FakeAnthropic(script) as server:
        rt, files = start(tmp_path, server, task)
        rt.run(threading.Event())
    failed = [e for e in journal(files, "llm.response") if not e.data["ok"]]
    assert [e.data["status"] for e in failed] == [529, 429, 0, 200, 503]
    # a stream cut short: httpx's RemoteProtocolError, or (anthropic 2.x on httpx2) an APIConnectionError that says the
    # peer closed the connection mid-body
    assert any(said in failed[2].data["error"] for said in ("RemoteProtocolError", "ended before", "peer closed"))
    assert "overloaded_error" in failed[3].data["error"]
    assert failed[1].data["retry_in"] == 0.3 and failed[1].data["retry_after"]
    assert failed[4].data["retry_in"] == 0.05
    waited = (datetime_of(failed[2]) - datetime_of(failed[1])).total_seconds()
    assert waited >= 0.29, "retry-after was honoured"
    assert [e.data["try"] for e in failed] == [1, 2, 3, 4, 5]
    # the same journaled request was sent six times, unchanged
    assert len(server.requests) == 6 and all(b == server.requests[0] for b in server.requests)
    assert len(journal(files, "llm.request")) == 1 and rt.state.status == "finished"
    files.close()


def datetime_of(event):
    from workbench.session.state import parse_ts

    return parse_ts(event.ts)


def test_malformed_or_invalid_arguments_are_tool_errors_and_the_run_goes_on(tmp_path, task):
    script = [
        Message([tool_use("t1", "edit_kernel", raw='{"search": "x", "replace": '),
                 tool_use("t2", "read_kernel", {"attempt": "two"}),
                 tool_use("t3", "rm_rf", {"path": "/"}),
                 tool_use("t4", "ledger", {"action": "explode"}),
                 tool_use("t5", "read_kernel", raw="[1, 2]")]),
        Message([tool_use("t6", "finish", {"reason": "done"})]),
    ]
    with FakeAnthropic(script) as server:
        rt, files = start(tmp_path, server, task)
        assert rt.run(threading.Event()) == "the model finished: done"
    results = server.requests[1]["messages"][-1]["content"][:5]
    assert all(r["type"] == "tool_result" and r["is_error"] for r in results)
    texts = [r["content"][0]["text"] for r in results]
    assert "not valid JSON" in texts[0] and "call it again" in texts[0]
    assert "attempt must be integer" in texts[1]
    assert "unknown tool 'rm_rf'" in texts[2]
    assert "action must be one of add, update" in texts[3]
    assert "expected an object" in texts[4]
    # the reply is sent back with the malformed call's input emptied (the API needs an object)
    assert server.requests[1]["messages"][1]["content"][0]["input"] == {}
    files.close()


def test_resume_rebuilds_the_exact_context_and_resends_a_request_in_flight(tmp_path, task):
    script = reading_script(stop_at=7)
    with FakeAnthropic(script) as server:
        rt, files = start(tmp_path, server, task, budget=Budget(max_tool_calls=3))
        assert rt.run(threading.Event()).startswith("budget: max tool calls")
        files.close()
        before = len(server.requests)
        rt, files = resume(tmp_path, files.id, server, task, budget=Budget(max_tool_calls=5))
        rt.run(threading.Event())
        files.close()
        # across the restart the history is unchanged and only the delta is new
        first_after = server.requests[before]
        assert plain(first_after["messages"][:-2]) == plain(server.requests[before - 1]["messages"])
        # a crash with a request in flight: journaled, never answered; resume sends the same request again
        server.script = [Status(500, "api_error")]
        rt, files = resume(tmp_path, files.id, server, task, budget=Budget(max_tool_calls=9), max_retries=0)
        with pytest.raises(BackendError, match="still failing after 1 tries"):
            rt.run(threading.Event())
        files.close()
        assert rt.state.status == "stopped" and rt.memory.pending
        server.script = script
        count = len(server.requests)
        rt, files = resume(tmp_path, files.id, server, task, budget=Budget(max_tool_calls=9))
        assert rt.run(threading.Event()) == "the model finished: enough"
        assert plain(server.requests[count]) == plain(server.requests[count - 1])
        requests = journal(files, "llm.request")
        assert [e.data["turn"] for e in requests] == list(range(1, len(requests) + 1))
        files.close()


def test_nudges_reach_the_next_turn_and_persistent_ones_stay_until_revoked(tmp_path, task):
    commands = queue.Queue()
    runtime = {}

    def on_request(body, index):
        if index == 1:
            commands.put(Command("nudge", "Keep the accumulator in fp32.", persistent=True))
        elif index == 2:
            commands.put(Command("nudge", "Look at the loads next."))
        elif index == 4:
            pid = next(n["id"] for n in runtime["rt"].state.nudges if n["persistent"])
            commands.put(Command("revoke", pid[:5]))

    with FakeAnthropic(reading_script(stop_at=7), on_request=on_request) as server:
        rt, files = start(tmp_path, server, task)
        runtime["rt"] = rt
        rt.run(threading.Event(), commands)
    last = [last_user_text(b) for b in server.requests]
    states = [t[t.index("<state>"):] for t in last]
    assert "Message from the person" in last[2] and "persistent until revoked" in last[2]
    in_force = ["Keep the accumulator in fp32." in s for s in states]
    assert in_force == [False, False, True, True, True, False, False, False]
    assert [t.count("Look at the loads next.") for t in last] == [0, 0, 0, 1, 0, 0, 0, 0]
    assert "revoked instruction" in last[5] and "no longer applies" in last[5]
    acked = [e.data for e in journal(files, "nudge.acked")]
    assert [a.get("revoked", False) for a in acked] == [False, False, True]
    assert "queued for the model's next turn" in acked[0]["note"]
    files.close()


class AskingSink(RecordingSink):
    def __init__(self):
        super().__init__()
        self.futures = []

    def ask(self, question):
        future = Future()
        self.futures.append((question, future))
        return future


def test_ask_person_does_not_block_and_the_answer_arrives_as_a_message(tmp_path, task):
    sink = AskingSink()

    def script(body, index):
        if index == 0:
            return Message([tool_use("t1", "ask_person", {"question": "fp16 allowed?"})])
        if index == 2:
            sink.futures[0][1].set_result("yes, inputs are fp32 but fp16 math is fine")
        if index == 4:
            return Message([tool_use(f"t{index}", "finish", {"reason": "done"})])
        return Message([tool_use(f"t{index}", "read_kernel")])

    with FakeAnthropic(script) as server:
        rt, files = start(tmp_path, server, task)
        rt.run(threading.Event(), sink=sink)
    assert "question sent" in all_text(server.requests[1])
    texts = [last_user_text(b) for b in server.requests]
    hits = [i for i, t in enumerate(texts) if "fp16 math is fine" in t]
    assert hits == [3]  # answered while request 2 was in flight, delivered with the next turn
    assert [n["origin"] for n in journal_nudges(files)] == ["answer"]
    files.close()


def journal_nudges(files):
    return [e.data for e in journal(files, "nudge.received")]


def test_max_cost_stops_the_run_resumably(tmp_path, task):
    reply = Message([tool_use("t", "read_kernel")], usage={"input_tokens": 1_000_000})
    with FakeAnthropic(lambda body, i: Message([tool_use(f"t{i}", "read_kernel")], usage=reply.usage)) as server:
        rt, files = start(tmp_path, server, task, budget=Budget(max_cost=5.0))
        reason = rt.run(threading.Event())
    assert reason == "budget: max cost ($5) reached" and rt.state.status == "stopped"
    assert len(server.requests) == 2 and rt.state.cost_usd >= 5.0  # $3 a call at Sonnet prices
    files.close()


def test_read_file_stays_inside_the_task_and_session_folders(tmp_path, task):
    outside = tmp_path / "secret.txt"
    outside.write_text("top secret")

    def script(body, index):
        if index == 0:
            (Path(rt_holder["rt"].files.dir) / "link.txt").symlink_to(outside)
            return Message([tool_use(f"a{i}", "read_file", {"path": p}) for i, p in enumerate((
                "reference.py", "task.toml", "../tiny/reference.py", "/etc/hostname", "link.txt", "~/x",
                "events.jsonl"))])
        return Message([tool_use("z", "finish", {"reason": "done"})])

    rt_holder = {}
    with FakeAnthropic(script) as server:
        rt, files = start(tmp_path / "s", server, task)
        rt_holder["rt"] = rt
        rt.run(threading.Event())
    results = server.requests[1]["messages"][-1]["content"][:7]
    flags = [r.get("is_error", False) for r in results]
    assert flags == [False, True, True, True, True, True, False]
    assert "def make_inputs" in json.dumps(results[0])
    assert "heldout" not in json.dumps(results[1]) and "outside its folder" in json.dumps(results[4])
    assert "top secret" not in json.dumps(server.requests)
    files.close()


def test_the_back_off_doubles_up_to_its_cap_and_never_passes_it():
    policy = RetryPolicy()
    waits = [policy.wait(n, None) for n in range(1, 200)]
    assert max(waits) <= policy.backoff_max == 30.0
    assert waits[0] <= 1.0 and 1.5 <= waits[1] <= 2.0 and min(waits[6:]) >= 0.75 * 30.0
    assert policy.wait(3, 120.0) == 120.0 and policy.wait(3, 5000.0) == policy.max_wait, "retry-after, up to a cap"


def test_key_and_model_are_checked_before_a_run(tmp_path, task):
    with FakeAnthropic([]) as server:
        good = anthropic.Anthropic(api_key=KEY, base_url=server.base_url, max_retries=0)
        bad = anthropic.Anthropic(api_key="sk-wrong", base_url=server.base_url, max_retries=0)
        assert AnthropicTransport(good).check_access(MODEL) is None and server.model_checks == [MODEL]
        with pytest.raises(BackendError, match=r"rejected the key \(401"):
            AnthropicTransport(bad).check_access(MODEL)
        with pytest.raises(BackendError, match="does not know model 'nope-1'"):
            AnthropicTransport(good).check_access("nope-1")
        # a rejected key mid-run stops the run with one clear line, resumable once fixed
        server.script = [Status(401, "authentication_error", "invalid x-api-key")]
        rt, files = start(tmp_path, server, task)
        with pytest.raises(BackendError, match="rejected the key"):
            rt.run(threading.Event())
        assert rt.state.status == "stopped" and "rejected the key" in rt.state.stop_reason
        files.close()
    unreachable = anthropic.Anthropic(api_key=KEY, base_url="http://127.0.0.1:9", max_retries=0)
    assert "could not check" in AnthropicTransport(unreachable).check_access(MODEL)


def test_a_prompt_too_long_for_the_model_is_compacted_harder_and_sent_once_more(tmp_path, task):
    too_long = Status(400, "invalid_request_error", "prompt is too long: 250123 tokens > 200000 maximum")
    script = [
        Message([tool_use("t1", "read_task")]),
        Message([tool_use("t2", "read_kernel")]),
        Message([tool_use("t3", "read_file", {"path": "reference.py"})]),
        too_long,
        Message([tool_use("t4", "read_kernel")]),
        too_long,
        too_long,
    ]
    with FakeAnthropic(script) as server:
        rt, files = start(tmp_path, server, task)
        with pytest.raises(BackendError, match="too long even after a compaction"):
            rt.run(threading.Event())
        bodies = list(server.requests)
    kinds = [(e.type, e.data.get("ok")) for e in journal(files) if e.type in ("llm.response", "memory.compacted")]
    # the first refusal: journaled, the context compacted below what was sent, the same request sent again
    assert kinds[3:6] == [("llm.response", False), ("memory.compacted", None), ("llm.response", True)]
    compacted = journal(files, "memory.compacted")[0].data
    assert compacted["limit"] < compacted["tokens_before"] and compacted["tokens_after"] <= compacted["limit"]
    assert len(bodies[4]["messages"]) < len(bodies[3]["messages"]) and "MEMORY" in all_text(bodies[4])
    # a prompt still too long after its compaction stops the run with one line, resumable
    assert rt.state.status == "stopped" and "too long even after a compaction" in rt.state.stop_reason
    files.close()
