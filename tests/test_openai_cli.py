"""The openai agent through the CLI, in real processes, with the real `openai` client against the stand-in server.

What is checked before a session is made (one line, exit 2, no session), what the journal keeps so a resume
talks to the same server at the same price, `show --prompt-at` printing the request the server received, the key
kept out of the session folder and the output, and the acceptance run of tests/long_run.py.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")

import long_run  # noqa: E402
from fake_openai import KEY, MODEL, Call, FakeOpenAI, Reply, Status, all_text, text_of  # noqa: E402
from workbench.journal import read_events  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "tasks"


def env(key=None, base_url=None):
    out = {**os.environ, "PYTHONPATH": str(ROOT), "WORKBENCH_KERNELS": str(FIXTURES)}
    for name, value in (("OPENAI_API_KEY", key), ("OPENAI_BASE_URL", base_url)):
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


def wb(*args, **kw):
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env(**kw))


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_turn(body):
    return "<state>" in json.dumps(body)


def test_what_cannot_work_is_one_line_and_exit_2_before_a_session(tmp_path):
    sessions = tmp_path / "sessions"
    common = ("--headless", "--device", "cpu", "--sessions-dir", str(sessions))

    def refused(*args, needle, **kw):
        proc = wb("run", "tiny", *args, *common, **kw)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr
        return proc.stderr

    refused("--agent", "openai", needle="the openai agent needs OPENAI_API_KEY set (or --base-url URL")
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    line = refused("--agent", "openai", "--base-url", dead, needle=f"cannot reach the model server at {dead}")
    assert "is it running" in line
    refused("--agent", "openai", "--base-url", "ftp://example.com/v1", needle="not an http(s) URL")
    refused("--agent", "openai", "--base-url", dead, "--price", "cheap", needle="--price cheap: give IN,OUT")
    refused("--agent", "openai", "--base-url", dead, "--price", "1,-2", needle="--price 1,-2: give IN,OUT")
    refused("--agent", "tuner", "--base-url", dead, needle="--base-url: the tuner agent takes no such setting")
    with FakeOpenAI([], key=None, tools=False) as server:  # vLLM started without --enable-auto-tool-choice
        line = refused("--agent", "openai", "--base-url", server.base_url, needle="cannot call tools")
        assert "--enable-auto-tool-choice" in line and "--tool-call-parser" in line
    markup = Reply('<tool_call>\n{"name": "read_task", "arguments": {}}\n</tool_call>')
    with FakeOpenAI([markup], key=None) as server:  # a server that leaves the model's tool-call markup unparsed
        refused("--agent", "openai", "--base-url", server.base_url, needle="wrote its tool call as text")
    with FakeOpenAI([], key=None, models=("a-7b", "b-70b")) as server:
        refused("--agent", "openai", "--base-url", server.base_url,
                needle="serves 2 models (a-7b, b-70b): pick one with --model")
        refused("--agent", "openai", "--base-url", server.base_url, "--model", "c-1b",
                needle="does not serve model 'c-1b' (404)")
    wrong = "sk-proj-wrong-8e2f6a1c9d3b7e5f0a4c2e6b"
    with FakeOpenAI([]) as server:  # echoes the refused key in its 401, as OpenAI does
        line = refused("--agent", "openai", "--base-url", server.base_url, "--model", MODEL, key=wrong,
                       needle="rejected the key (401): check OPENAI_API_KEY")
        assert server.tokens == [wrong]
    assert wrong not in line
    assert not sessions.exists(), "no session is made before the server, key, model and tools are checked"


def test_a_local_server_needs_no_key_and_a_resume_talks_to_the_journaled_server_at_the_given_price(tmp_path):
    sessions = str(tmp_path / "sessions")

    def script(body, index):
        if not is_turn(body):
            return Reply(calls=[Call("p0", "read_task")])
        n = sum(1 for b in server.requests[:index] if is_turn(b))
        if n == 1:
            return Status(429, "Rate limit reached", "requests", "rate_limit_exceeded", {"retry-after": "0.01"})
        if n == 3:
            return Reply(calls=[Call("t9", "finish", {"reason": "enough"})])
        return Reply(f"Step {n}.", [Call(f"t{n}a", "read_task"), Call(f"t{n}b", "read_kernel")])

    with FakeOpenAI(script, key=None) as server:
        run = wb("run", "tiny", "--agent", "openai", "--base-url", server.base_url, "--headless", "--device", "cpu",
                 "--max-tool-calls", "3", "--sessions-dir", sessions)
        assert run.returncode == 0, run.stderr
        assert run.stderr.splitlines() == [f"workbench: warning: no price is known for model {MODEL!r}: its tokens "
                                           "count as $0 (set one with --price IN,OUT, USD per million tokens)"]
        assert "retry 1 in 0.0 s" in run.stdout and "429 rate_limit_exceeded" in run.stdout
        session_id = run.stdout.splitlines()[0]
        folder = Path(sessions) / session_id
        events = list(read_events(folder / "events.jsonl"))
        created = events[0].data
        assert created["agent"] == "openai" and created["endpoint"] == {"base_url": server.base_url, "stream": True}
        started = [e.data for e in events if e.type == "run.started"]
        assert started[0]["model"] == MODEL and started[0]["endpoint"] == created["endpoint"]
        assert set(server.tokens) == {"EMPTY"}, "no key: the client sends a placeholder, never a real one"
        before = len(server.requests)

        # the resume finds the server in the journal (not in OPENAI_BASE_URL, which points elsewhere)
        dead = f"http://127.0.0.1:{closed_port()}/v1"
        resumed = wb("resume", session_id, "--headless", "--price", "2,8,0.5", "--max-tool-calls", "9",
                     "--sessions-dir", sessions, base_url=dead)
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stderr == "" and "stopped: the model finished: enough" in resumed.stdout
        assert len(server.requests) > before
        events = list(read_events(folder / "events.jsonl"))
        started = [e.data for e in events if e.type == "run.started"]
        assert started[1]["endpoint"] == {"base_url": server.base_url, "stream": True, "price": [2.0, 8.0, 0.5]}
        replies = [e.data for e in events if e.type == "llm.response" and e.data["ok"]]
        first = replies[0]
        assert not first["priced"] and first["cost_usd"] == 0
        last = replies[-1]
        assert last["priced"] and last["cost_usd"] == pytest.approx(
            (last["input_tokens"] * 2 + last["cache_read_input_tokens"] * 0.5 + last["output_tokens"] * 8) / 1e6)
        # a second resume keeps the price without being told again
        again = wb("resume", session_id, "--headless", "--max-tool-calls", "9", "--sessions-dir", sessions)
        assert again.returncode == 0 and again.stderr == "", again.stderr
        assert [e.data for e in read_events(folder / "events.jsonl")
                if e.type == "run.started"][-1]["endpoint"]["price"] == [2.0, 8.0, 0.5]

        summary = json.loads(wb("show", session_id, "--json", "--sessions-dir", sessions).stdout)
        assert summary["agent"] == "openai" and summary["model"] == MODEL
        assert summary["endpoint"]["base_url"] == server.base_url
        shown = wb("show", session_id, "--sessions-dir", sessions).stdout
        assert f"model {MODEL} at {server.base_url}  price $2/$8 per million tokens in/out" in shown

        # show --prompt-at prints each request exactly as the server received it
        turns = [b for b in server.requests if is_turn(b)]
        sent = [turns[0]] + [b for previous, b in zip(turns, turns[1:]) if b != previous]
        assert len(sent) == len(turns) - 1, "the request the 429 refused was sent again unchanged"
        requests = [e for e in read_events(folder / "events.jsonl") if e.type == "llm.request"]
        assert len(requests) == len(sent) >= 4
        for event, body in zip(requests, sent):
            shown = wb("show", session_id, "--prompt-at", str(event.seq), "--json", "--sessions-dir", sessions)
            assert json.loads(shown.stdout) == body
        assert body["messages"][0]["role"] == "system" and "GOAL CONTRACT" in body["messages"][0]["content"]
        assert [m["role"] for m in body["messages"][-3:]] == ["tool", "tool", "user"]
        view = wb("show", session_id, "--prompt-at", str(requests[2].seq), "--sessions-dir", sessions).stdout
        assert view.startswith("context of turn 3") and "[tool_use t2a] read_task" in view


class OpenAI:
    """The chat-completions side of the acceptance run (tests/long_run.py)."""

    key = KEY

    def server(self, script, on_request):
        return FakeOpenAI(script, on_request=on_request)

    def env(self, server):
        # OPENAI_BASE_URL points nowhere: every run must reach the server through --base-url or the journal
        return {"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": f"http://127.0.0.1:{closed_port()}/v1"}

    def run_args(self, server):
        return ["--agent", "openai", "--base-url", server.base_url, "--price", "0.5,2"]

    def reply(self, turn):
        if turn.fault == "overloaded":
            return Status(503, "Service Unavailable: the engine is busy", headers={"retry-after-ms": "20"})
        if turn.fault == "rate_limited":
            return Status(429, "Rate limit reached", "requests", "rate_limit_exceeded", {"retry-after": "0.02"})
        return Reply(turn.text, [Call(ref, name, args or {}, raw=long_run.MALFORMED if args is None else None)
                                 for ref, name, args in turn.calls])

    def is_reply(self, reply):
        return isinstance(reply, Reply)

    def units(self, body):
        """Each assistant message, and each run of tool and user messages between them."""
        out = []
        for message in body["messages"][1:]:
            if message["role"] == "assistant" or not out or isinstance(out[-1], dict):
                out.append(message if message["role"] == "assistant" else [message])
            else:
                out[-1].append(message)
        return out

    def sent_reply(self, reply):
        message = {"role": "assistant", "content": reply.text or None}
        if reply.calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": "{}" if c.raw is not None else json.dumps(c.args)}} for c in reply.calls]
        return message

    def system(self, body):
        return body["messages"][0]["content"]

    def summary(self, body):
        return text_of(body["messages"][1])

    def state(self, body):
        last = text_of(body["messages"][-1])
        return last[last.rindex("<state>"):]

    def all_text(self, body):
        return all_text(body)

    def tell_text(self, body):
        return json.dumps(self.units(body)[-1])

    def last_call(self, reply):
        return reply.calls[-1].name


@pytest.mark.slow
def test_a_thousand_tool_calls_through_compactions_and_two_kill_9_resumes(tmp_path):
    folder = long_run.run(OpenAI(), tmp_path)
    events = list(read_events(folder / "events.jsonl"))
    # every run talked to the server the first one was pointed at, at the price it was given, with the model the
    # server said it serves
    started = [e.data for e in events if e.type == "run.started"]
    assert len({json.dumps(s["endpoint"], sort_keys=True) for s in started}) == 1
    assert all(s["model"] == MODEL and s["endpoint"]["price"] == [0.5, 2.0] for s in started)
    replies = [e.data for e in events if e.type == "llm.response" and e.data["ok"]]
    assert all(r["priced"] and r["cost_usd"] > 0 for r in replies)
