"""The claude agent through the CLI, in real processes, against the fake Messages API.

The long test is the issue's acceptance run: 1,000 tool calls through several compactions and two
SIGKILL-and-resume cycles, ending with the goal, every failed strategy and every persistent nudge still in the
model's context, as seen on the requests the server received.
"""

import copy
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("anthropic")

from fake_anthropic import KEY, Drop, FakeAnthropic, Message, Status, all_text, text, tool_use  # noqa: E402
from workbench.agent.memory import SessionMemory  # noqa: E402
from workbench.journal import read_events  # noqa: E402
from workbench.session import SessionStore  # noqa: E402
from workbench.session.replay import load_state  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "tasks"
SEED = (FIXTURES / "tiny" / "seed.py").read_text()
TOTAL = 1000
BUDGET = 16000
IDEAS = ["vector loads", "two rows per program", "fp16 staging", "loop unrolling", "persistent programs",
         "block size 1024", "split reduction", "cache hints", "masked tail", "fused scale"]
NUDGES = {
    150: ("P1", "Never use bf16 for the accumulator.", True),
    420: ("P2", "Prefer numerically identical rewrites; the tolerance is 1e-6.", True),
    560: ("O1", "Have a look at the loads when you can.", False),
    600: ("P3", "Temporarily avoid whole-file rewrites.", True),
}
REVOKE_AT = 800
REAL_EVALS = {5, 705, 905}
KILLED_EVAL = 705
"""The second kill lands while this evaluation runs: its intent is journaled, its result never is."""


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

    def on_request(body, index):
        if index == 1 and not outage:  # the API goes away with this request in flight, for 3 s
            outage.append(time.monotonic())
            server.go_away()
            threading.Timer(3.0, server.come_back).start()

    script = [Message([tool_use("t1", "read_task")]), Drop(Message([text("cut short")]), after=1),
              Message([tool_use("t2", "finish", {"reason": "back again"})])]
    sessions = tmp_path / "s"
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


def good(i):
    return SEED + f"\n# rev {i}\n"


def bad(k, again=False):
    """A variant that imports a banned library (a fast 'forbidden' verdict); each variant is its own change."""
    head = f"import torch\nimport flash_attn\n\nVARIANT = {k}\n"
    return SEED.replace("import torch\n", head) + f"\n# {'again ' if again else ''}variant {k}\n"


def call_for(i):
    """The scripted agent's i-th tool call (0-based): mostly cheap reads, a strategy per hundred calls that fails."""
    k, r = divmod(i, 100)
    sid = f"S{k + 1}"
    if i == 0:
        return "read_task", {}
    if i == 1:
        return "read_kernel", {}
    if i == 2:
        return "read_file", {"path": "reference.py"}
    if r == 10:
        return "ledger", {"action": "add", "strategy": f"variant {k}: {IDEAS[k]}", "status": "trying",
                          "expected": "a few percent faster"}
    if r == 60:
        return "write_kernel", {"source": bad(k), "strategy": sid, "note": f"variant {k}"}
    if r in (61, 81):
        return "evaluate", {}
    if r == 62:
        return "ledger", {"action": "update", "id": sid, "status": "failed",
                          "why": f"the kernel imports flash_attn (variant {k})"}
    if r == 80:
        return "write_kernel", {"source": bad(k, again=True), "note": f"try variant {k} again"}
    if i in REAL_EVALS:
        return "evaluate", {}
    if i % 157 == 40:
        return "edit_kernel", None  # malformed arguments
    if r % 10 == 3:
        return "write_kernel", {"source": good(i), "note": f"rev {i}"}
    if r % 10 == 7:
        return "list_attempts", {"last": 5}
    if r % 10 == 8 and i > 20:
        return "diff_attempts", {"a": 1, "b": 2}
    if r % 10 == 9:
        return "show_best", {}
    return "read_kernel", {}


def tool_calls_in(body):
    last = body["messages"][-1]["content"]
    state = next(b["text"] for b in reversed(last) if b.get("type") == "text" and "<state>" in b.get("text", ""))
    return int(re.search(r"tool_calls=(\d+)", state).group(1))


def script(body, index):
    if index % 37 == 11:
        return Status(529, "overloaded_error", "Overloaded", headers={"retry-after-ms": "20"})
    if index % 53 == 17:
        return Status(429, "rate_limit_error", "slow down", headers={"retry-after": "0.02"})
    n = tool_calls_in(body)
    k = min(n // 100, len(IDEAS) - 1)
    if n >= TOTAL:
        return Message([tool_use(f"toolu_{n:05d}", "finish", {"reason": "1,000 calls done"})])
    blocks = [text(f"Plan at {n}: keep the best correct kernel and explore {IDEAS[k]} next.")]
    for i in range(n, min(n + 1 + n % 3, TOTAL)):
        name, args = call_for(i)
        if args is None:
            blocks.append(tool_use(f"toolu_{i:05d}", name, raw='{"search": "x", "replace": '))
        else:
            blocks.append(tool_use(f"toolu_{i:05d}", name, args))
    return Message(blocks)


def plain(value):
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        value.pop("cache_control", None)
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def sent_reply(reply):
    """The assistant message the client must send back for a scripted reply."""
    out = []
    for block in reply.blocks:
        if block["type"] == "text":
            out.append({"type": "text", "text": block["text"]})
        else:
            raw = block.get("raw")
            out.append({"type": "tool_use", "id": block["id"], "name": block["name"],
                        "input": {} if raw is not None else block["input"]})
    return {"role": "assistant", "content": out}


def state_text(body):
    last = body["messages"][-1]["content"]
    return next(b["text"] for b in reversed(last) if b.get("type") == "text" and "<state>" in b.get("text", ""))


def wait_for_intent(journal, call_id, proc, timeout=240):
    """Return as soon as the journal holds the tool.call `call_id` (reading only what was appended since)."""
    offset, pending, deadline = 0, b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(journal, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        offset += len(chunk)
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if b'"tool.call"' in line and f'"call_id": "{call_id}"'.encode() in line:
                return
        assert proc.poll() is None, "the run ended before the call to kill it in"
        time.sleep(0.02)
    raise AssertionError(f"{call_id} was never journaled")


@pytest.mark.slow
def test_a_thousand_tool_calls_through_compactions_and_two_kill_9_resumes(tmp_path):
    sessions, logs = tmp_path / "sessions", tmp_path / "logs"
    logs.mkdir()
    info = {"id": None, "done": set(), "replies": {}, "arrivals": []}
    kill_now, killed = threading.Event(), threading.Event()

    def on_request(body, index):
        info["arrivals"].append((time.monotonic(), index))
        n = tool_calls_in(body)
        if info["id"] is not None:
            reader = SessionStore(sessions).open(info["id"], writer=False)
            for at, (name, words, persistent) in NUDGES.items():
                if n >= at and name not in info["done"]:
                    info["done"].add(name)
                    reader.drop_nudge(words, persistent=persistent)
            if n >= REVOKE_AT and "revoke" not in info["done"]:
                info["done"].add("revoke")
                target = next(e.data["id"] for e in reader.read_events()
                              if e.type == "nudge.received" and e.data["text"] == NUDGES[600][1])
                reader.drop_nudge(f"/revoke {target}", persistent=False)
        if n >= 330 and not kill_now.is_set():
            kill_now.set()  # the client dies with this request in flight
            killed.wait(60)

    def recorded(body, index):
        reply = script(body, index)
        info["replies"][index] = reply
        return reply

    def start(*args):
        out = open(logs / f"out{len(list(logs.iterdir()))}.txt", "w+")
        proc = subprocess.Popen([sys.executable, "-m", "workbench", *args, "--sessions-dir", str(sessions)],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True, env=env(server))
        return proc, out

    def first_line(out, proc):
        for _ in range(600):
            out.seek(0)
            line = out.readline()
            if line.endswith("\n"):
                return line.strip()
            assert proc.poll() is None, "the run ended before printing its id"
            time.sleep(0.05)
        raise AssertionError("no session id printed")

    started = time.monotonic()
    with FakeAnthropic(recorded, on_request=on_request) as server:
        proc, out = start("run", "tiny", "--agent", "claude", "--headless", "--device", "cpu",
                          "--context-budget", str(BUDGET), "--max-tool-calls", str(TOTAL + 50))
        info["id"] = first_line(out, proc)
        assert kill_now.wait(240), "the first kill point was never reached"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        killed.set()

        resume_started = time.monotonic()
        proc, out = start("resume", info["id"], "--headless")
        wait_for_intent(sessions / info["id"] / "events.jsonl", f"c{KILLED_EVAL + 1:06d}", proc)
        resumed_first = next(t for t, i in info["arrivals"] if t > resume_started)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

        proc, out = start("resume", info["id"], "--headless")
        assert proc.wait(300) == 0, (logs / "out2.txt").read_text()[-2000:]
    elapsed = time.monotonic() - started
    bodies = server.requests

    folder = sessions / info["id"]
    events = list(read_events(folder / "events.jsonl"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    by_type = {}
    for e in events:
        by_type.setdefault(e.type, []).append(e)
    calls = {e.data["call_id"] for e in by_type["tool.call"]}
    assert calls == {e.data["call_id"] for e in by_type["tool.result"]} and len(calls) >= TOTAL
    written = [e.data["attempt"] for e in by_type["attempt.written"]]
    assert written == list(range(1, len(written) + 1)), "no attempt number is reused"
    assert [e.data["resumed"] for e in by_type["run.started"]] == [False, True, True]
    assert by_type["run.stopped"][-1].data == {"reason": "the model finished: 1,000 calls done", "final": True}

    # the evaluation the second kill interrupted was closed as aborted, and the model was told
    aborted = [e.data for e in by_type["tool.result"] if e.data.get("aborted")]
    assert [(a["call_id"], a["tool"]) for a in aborted] == [(f"c{KILLED_EVAL + 1:06d}", "evaluate")]
    told = [b for b in bodies if f"toolu_{KILLED_EVAL:05d}" in json.dumps(b["messages"][-1])]
    assert told and "interrupted: the process ended" in json.dumps(told[0]["messages"][-1])

    # several compactions, each audited: goal, failed strategies, best result and persistent nudges survived
    compactions = by_type["memory.compacted"]
    assert len(compactions) >= 3 and all(c.data["audit"]["ok"] for c in compactions)
    # the context stayed under its budget on every turn
    requests = by_type["llm.request"]
    assert max(r.data["context_tokens"] for r in requests) <= BUDGET

    # every request either re-sends the previous one, or keeps its history and adds the reply and one delta,
    # or starts from a fresh compaction summary followed by a suffix of that history: across both kills too
    resends = extends = compacted = 0
    for (i, r1), r2 in zip(enumerate(bodies), bodies[1:]):
        m1, m2 = plain(r1["messages"]), plain(r2["messages"])
        if m2 == m1:
            resends += 1
            continue
        reply = info["replies"][i]
        assert isinstance(reply, Message), f"request {i + 1} follows a failed request {i} without re-sending it"
        assert m2[-2] == sent_reply(reply), f"request {i + 1} does not carry the reply to request {i}"
        if m2[:-2] == m1:
            extends += 1
        else:
            assert m2[0]["content"][0]["text"].startswith("MEMORY (compaction #"), f"request {i + 1}"
            history = m1 + [m2[-2]]
            kept = m2[1:-1]
            assert history[len(history) - len(kept):] == kept, f"request {i + 1} kept something new"
            compacted += 1
    assert compacted == len(compactions) and resends >= 2 and extends > 300

    final = bodies[-1]
    assert info["replies"][len(bodies) - 1].blocks[-1]["name"] == "finish"
    assert "GOAL CONTRACT" in final["system"][0]["text"] and "task: tiny" in final["system"][0]["text"]
    assert "rel_rms <= 1e-06" in final["system"][0]["text"]
    everything, state = all_text(final), state_text(final)
    ledger = by_type["ledger.updated"][-1].data["ledger"]
    failed = [e for e in ledger if e["status"] == "failed"]
    assert len(failed) == len(IDEAS)
    for entry in failed:
        line = f"{entry['id']} [failed] {entry['strategy']}"
        assert line in state and line in everything
    summary = final["messages"][0]["content"][0]["text"]
    assert summary.startswith("MEMORY") and all(f"{e['id']} [failed]" in summary for e in failed)
    for name, words, persistent in NUDGES.values():
        if name in ("P1", "P2"):
            assert words in state and words in summary
        else:
            assert words not in state
    # the "already tried" rule fired before each repeat's evaluation, citing the evidence
    refusals = [e for e in by_type["tool.result"] if "already FAILED" in e.data.get("error", "")]
    assert len(refusals) >= len(IDEAS) and all("forbidden" in e.data["error"] for e in refusals)
    verdicts = [e.data["result"]["verdict"] for e in by_type["eval.finished"]]
    # the banned import is caught statically; the other evaluations ran the real evaluator in fresh processes
    # (their verdict is the evaluator's business, tested in test_evaluator.py)
    assert verdicts.count("forbidden") >= len(IDEAS) and len(verdicts) - verdicts.count("forbidden") >= 2

    # the key never reaches the journal, session files or logs
    for path in [*folder.rglob("*"), *logs.iterdir()]:
        if path.is_file():
            data = path.read_bytes()
            assert KEY.encode() not in data and b"Bearer" not in data, path

    # figures for the record: journal size, resume time, context per turn
    t0 = time.monotonic()
    files = SessionStore(sessions).open(info["id"], writer=False)
    state_obj = load_state(files)
    SessionMemory.load(files, state_obj, "messages")
    load_s = time.monotonic() - t0
    size = (folder / "events.jsonl").stat().st_size
    tokens = [r.data["context_tokens"] for r in requests]
    rows = []
    for lo in range(0, len(tokens), 50):
        chunk = tokens[lo:lo + 50]
        rows.append(f"turns {lo + 1:>4}-{lo + len(chunk):<4} context tokens min {min(chunk):>6} "
                    f"max {max(chunk):>6} (budget {BUDGET})")
    print(f"\n1,000-call run: {len(events)} events, journal {size / 1e6:.2f} MB, {len(requests)} turns, "
          f"{len(compactions)} compactions, {len(bodies)} HTTP requests, wall {elapsed:.1f} s")
    print(f"resume: state + memory rebuilt in {load_s * 1000:.0f} ms in-process; "
          f"CLI resume to first request {resumed_first - resume_started:.2f} s")
    print("\n".join(rows))
    assert load_s < 2.0
