"""The claude agent through the CLI, in real processes, against the fake Messages API.

The long test is the issue's acceptance run (tests/long_run.py, shared with the openai backend): 1,000 tool calls
through several compactions and two SIGKILL-and-resume cycles, ending with the goal, every failed strategy and
every persistent nudge still in the model's context, as seen on the requests the server received.
"""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("anthropic")

import long_run  # noqa: E402
from fake_anthropic import KEY, Drop, FakeAnthropic, Message, Status, all_text, plain, text, tool_use  # noqa: E402
from workbench.journal import read_events  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "tasks"
SEED = (FIXTURES / "tiny" / "seed.py").read_text()


def env(server=None, key=KEY, base_url=None):
    out = {**os.environ, "PYTHONPATH": str(ROOT), "WORKBENCH_KERNELS": str(FIXTURES)}
    out.pop("ANTHROPIC_AUTH_TOKEN", None)
    if key is None:
        out.pop("ANTHROPIC_API_KEY", None)
    else:
        out["ANTHROPIC_API_KEY"] = key
    if server is not None:
        out["ANTHROPIC_BASE_URL"] = server.base_url
    if base_url is not None:
        out["ANTHROPIC_BASE_URL"] = base_url
    return out


def wb(*args, **kw):
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env(**kw))


def test_missing_rejected_key_and_unknown_model_are_one_line_exit_2(tmp_path):
    proc = wb("run", "tiny", "--agent", "claude", "--headless", "--sessions-dir", str(tmp_path), key=None)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "needs ANTHROPIC_API_KEY" in proc.stderr
    with FakeAnthropic([]) as server:
        proc = wb("run", "tiny", "--headless", "--sessions-dir", str(tmp_path), server=server, key="sk-ant-wrong")
        assert proc.returncode == 2 and "rejected the key (401" in proc.stderr and proc.stderr.count("\n") == 1
        proc = wb("run", "tiny", "--model", "nope-9", "--headless", "--sessions-dir", str(tmp_path), server=server)
        assert proc.returncode == 2 and "does not know model 'nope-9'" in proc.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir()), "no session is created before the key is checked"


def test_an_unreachable_model_api_is_one_line_and_exit_2_before_a_session_is_made(tmp_path):
    sessions = tmp_path / "s"
    for url, why in (("http://127.0.0.1:1", "connection refused"),
                     ("http://no-such-host.invalid:8080", "does not resolve")):
        proc = wb("run", "tiny", "--agent", "claude", "--headless", "--sessions-dir", str(sessions), base_url=url)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"cannot reach the model API at {url}" in proc.stderr and why in proc.stderr, proc.stderr
    assert not sessions.exists() or not any(sessions.iterdir()), "no session is made for an API nobody can reach"
    # a resume of a stopped session, with the API gone since: one line, and the journal untouched
    with FakeAnthropic([Message([tool_use("t1", "read_task")])]) as server:
        run = wb("run", "tiny", "--headless", "--device", "cpu", "--max-tool-calls", "1", "--sessions-dir",
                 str(sessions), server=server)
        assert run.returncode == 0, run.stderr
        url = server.base_url
    (journal,) = sessions.glob("*/events.jsonl")
    before = journal.read_bytes()
    proc = wb("resume", run.stdout.splitlines()[0], "--headless", "--sessions-dir", str(sessions), base_url=url)
    assert proc.returncode == 2 and "connection refused" in proc.stderr and proc.stderr.count("\n") == 1
    assert journal.read_bytes() == before


def test_an_outage_mid_run_is_waited_out_with_capped_back_off_and_said_so(tmp_path):
    outage: list[float] = []

    sessions = tmp_path / "s"

    def back_after_two_failed_tries():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            journals = list(sessions.glob("*/events.jsonl"))
            if journals and sum(1 for e in read_events(journals[0]) if e.type == "llm.response"
                                and not e.data["ok"]) >= 2:
                break
            time.sleep(0.05)
        server.come_back()

    def on_request(body, index):
        if index == 1 and not outage:  # the API goes away with this request in flight, until two tries failed
            outage.append(time.monotonic())
            server.go_away()
            threading.Thread(target=back_after_two_failed_tries, daemon=True).start()

    script = [Message([tool_use("t1", "read_task")]), Drop(Message([text("cut short")]), after=1),
              Message([tool_use("t2", "finish", {"reason": "back again"})])]
    with FakeAnthropic(script, on_request=on_request) as server:
        run = wb("run", "tiny", "--headless", "--device", "cpu", "--sessions-dir", str(sessions), server=server)
        requests = list(server.requests)
    assert run.returncode == 0, run.stderr
    events = list(read_events(next(sessions.glob("*/events.jsonl"))))
    failed = [e.data for e in events if e.type == "llm.response" and not e.data["ok"]]
    assert len(failed) >= 2 and [f["try"] for f in failed] == list(range(1, len(failed) + 1))
    assert any("Connection refused" in f["error"] for f in failed), failed
    assert all(0 < f["retry_in"] <= 30 for f in failed)
    assert "waiting for the model API (retry 2 in" in run.stdout
    assert events[-2].data == {"reason": "the model finished: back again", "final": True}
    assert requests[-1] == requests[1], "after the outage the journaled request is sent again, unchanged"


def test_past_max_api_wait_the_run_stops_resumable_and_resumes_once_the_api_is_back(tmp_path):
    def on_request(body, index):
        if index == 0:  # the first reply still goes out; then the API is gone for good
            server.go_away()

    script = [Message([tool_use("t1", "read_task")]), Message([tool_use("t2", "finish", {"reason": "back"})])]
    sessions = tmp_path / "s"
    with FakeAnthropic(script, on_request=on_request) as server:
        started = time.monotonic()
        run = wb("run", "tiny", "--headless", "--device", "cpu", "--max-api-wait", "2", "--sessions-dir",
                 str(sessions), server=server)
        took = time.monotonic() - started
        assert run.returncode == 0, run.stderr
        session_id = run.stdout.splitlines()[0]
        events = list(read_events(sessions / session_id / "events.jsonl"))
        stopped = events[-2].data
        assert events[-1].type == "checkpoint.written" and stopped["final"] is False
        assert stopped["reason"].startswith("the model API kept failing for 2 s (--max-api-wait 2 s)")
        assert "Connection refused" in stopped["reason"] and took < 30
        assert f"stopped: {stopped['reason']}" in run.stdout
        sent = len(server.requests)
        server.come_back()
        resumed = wb("resume", session_id, "--headless", "--sessions-dir", str(sessions), server=server)
        assert resumed.returncode == 0, resumed.stderr
        assert "stopped: the model finished: back" in resumed.stdout
    events = list(read_events(sessions / session_id / "events.jsonl"))
    turns = [e.data["turn"] for e in events if e.type == "llm.request"]
    assert sent == 1 and len(server.requests) == 2 and turns == [1, 2], \
        "the request the outage cut off is journaled once, and the one the resume sent"


def test_claude_is_the_default_with_a_key_and_show_prompt_at_prints_what_the_model_saw(tmp_path):
    script = [
        Message([text("Reading."), tool_use("t1", "read_kernel")]),
        Status(529, "overloaded_error", headers={"retry-after-ms": "10"}),
        Message([tool_use("t2", "ledger", {"action": "add", "strategy": "x + x instead of 2 * x"})]),
        Message([tool_use("t3", "finish", {"reason": "enough"})]),
    ]
    sessions = str(tmp_path / "s")
    with FakeAnthropic(script) as server:
        run = wb("run", "tiny", "--headless", "--device", "cpu", "--sessions-dir", sessions, server=server)
        assert run.returncode == 0, run.stderr
        assert "retry 1 in 0.0 s" in run.stdout and "529 overloaded_error" in run.stdout
        session_id = run.stdout.splitlines()[0]
        events = list(read_events(Path(sessions) / session_id / "events.jsonl"))
        requests = [e for e in events if e.type == "llm.request"]
        assert len(requests) == 3 and events[2].data["agent"] == "claude"
        # any seq from a request up to the next one shows that request's context
        for seq in (requests[1].seq, requests[2].seq - 1):
            shown = wb("show", session_id, "--prompt-at", str(seq), "--json", "--sessions-dir", sessions)
            body = json.loads(shown.stdout)
            assert body["messages"] == server.requests[2]["messages"] and body["system"] == server.requests[2]["system"]
        text_view = wb("show", session_id, "--prompt-at", str(events[-1].seq), "--sessions-dir", sessions).stdout
        assert text_view.startswith("context of turn 3") and "=== system ===" in text_view
        assert "GOAL CONTRACT" in text_view and "S1 [planned] x + x instead of 2 * x" in text_view
        assert "[tool_use t2] ledger" in text_view
        early = wb("show", session_id, "--prompt-at", "2", "--sessions-dir", sessions).stdout
        assert early.startswith("no model request at or before seq 2")


def test_a_first_evaluate_evaluates_the_starting_kernel_which_is_attempt_1(tmp_path):
    start = tmp_path / "mine.py"
    start.write_text(SEED.replace("x * 2.0", "x + x"))
    script = [
        Message([tool_use("t1", "write_kernel", {"source": start.read_text()})]),  # the start, verbatim
        Message([tool_use("t2", "evaluate", {})]),
        Message([tool_use("t3", "finish", {"reason": "measured the start"})]),
    ]
    sessions = tmp_path / "s"
    with FakeAnthropic(script) as server:
        run = wb("run", "tiny", "--headless", "--device", "cpu", "--start", str(start), "--sessions-dir",
                 str(sessions), server=server)
        assert run.returncode == 0, run.stderr
        first_request = all_text(server.requests[0])
    events = list(read_events(next(sessions.glob("*/events.jsonl"))))
    written = [e.data for e in events if e.type == "attempt.written"]
    assert len(written) == 1 and written[0]["attempt"] == 1 and written[0]["author"] == "start"
    assert written[0]["source"] == start.read_text() and written[0]["note"] == "--start mine.py"
    assert written[0]["params"] == {"BLOCK": 64} and written[0]["parent"] is None
    assert "attempt 1 is the kernel this session starts from" in first_request
    results = [e.data for e in events if e.type == "tool.result"]
    assert "identical to attempt 1 (not evaluated)" in results[0]["error"]
    assert results[1]["ok"] and results[1]["summary"].startswith("attempt 1: ok")
    assert [e.data["attempt"] for e in events if e.type == "eval.finished" and "check" not in e.data] == [1]
    assert "attempt    1  ok" in run.stdout and "[--start mine.py]" in run.stdout


class Claude:
    """The Messages API's side of the acceptance run (tests/long_run.py)."""

    key = KEY

    def server(self, script, on_request):
        return FakeAnthropic(script, on_request=on_request)

    def env(self, server):
        return {"ANTHROPIC_API_KEY": KEY, "ANTHROPIC_AUTH_TOKEN": None, "ANTHROPIC_BASE_URL": server.base_url}

    def run_args(self, server):
        return ["--agent", "claude"]

    def reply(self, turn):
        if turn.fault == "overloaded":
            return Status(529, "overloaded_error", "Overloaded", headers={"retry-after-ms": "20"})
        if turn.fault == "rate_limited":
            return Status(429, "rate_limit_error", "slow down", headers={"retry-after": "0.02"})
        blocks = [text(turn.text)] if turn.text else []
        for ref, name, args in turn.calls:
            blocks.append(tool_use(ref, name, raw=long_run.MALFORMED) if args is None else tool_use(ref, name, args))
        return Message(blocks)

    def is_reply(self, reply):
        return isinstance(reply, Message)

    def units(self, body):
        return plain(body["messages"])

    def sent_reply(self, reply):
        out = []
        for block in reply.blocks:
            if block["type"] == "text":
                out.append({"type": "text", "text": block["text"]})
            else:
                out.append({"type": "tool_use", "id": block["id"], "name": block["name"],
                            "input": {} if block.get("raw") is not None else block["input"]})
        return {"role": "assistant", "content": out}

    def system(self, body):
        return body["system"][0]["text"]

    def summary(self, body):
        return body["messages"][0]["content"][0].get("text", "")

    def state(self, body):
        last = body["messages"][-1]["content"]
        return next(b["text"] for b in reversed(last) if b.get("type") == "text" and "<state>" in b.get("text", ""))

    def all_text(self, body):
        return all_text(body)

    def tell_text(self, body):
        return json.dumps(body["messages"][-1])

    def last_call(self, reply):
        return reply.blocks[-1]["name"]



@pytest.mark.slow
def test_a_thousand_tool_calls_through_compactions_and_two_kill_9_resumes(tmp_path):
    long_run.run(Claude(), tmp_path)
