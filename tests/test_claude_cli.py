"""The claude agent through the CLI, in real processes, against the fake Messages API.

The long test is the issue's acceptance run (tests/long_run.py, shared with the openai backend): 1,000 tool calls
through several compactions and two SIGKILL-and-resume cycles, ending with the goal, every failed strategy and
every persistent nudge still in the model's context, as seen on the requests the server received.
"""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("anthropic")

import long_run  # noqa: E402
from fake_anthropic import KEY, FakeAnthropic, Message, Status, all_text, text, tool_use  # noqa: E402
from workbench.journal import read_events  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "tasks"


def env(server=None, key=KEY):
    out = {**os.environ, "PYTHONPATH": str(ROOT), "WORKBENCH_KERNELS": str(FIXTURES)}
    out.pop("ANTHROPIC_AUTH_TOKEN", None)
    if key is None:
        out.pop("ANTHROPIC_API_KEY", None)
    else:
        out["ANTHROPIC_API_KEY"] = key
    if server is not None:
        out["ANTHROPIC_BASE_URL"] = server.base_url
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


def plain(value):
    """A request part without cache breakpoints (they move every turn by design)."""
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        value.pop("cache_control", None)
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


@pytest.mark.slow
def test_a_thousand_tool_calls_through_compactions_and_two_kill_9_resumes(tmp_path):
    long_run.run(Claude(), tmp_path)
