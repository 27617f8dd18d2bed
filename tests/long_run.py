"""The acceptance run every LLM backend must pass, whatever its wire format: 1,000 tool calls through many
compactions and two SIGKILL-and-resume cycles, in real processes, against a local stand-in of the model API.

A scripted model makes the calls (cheap reads mostly, one strategy per hundred calls that fails and is then
repeated, so the already-tried guard must refuse it, malformed arguments now and then), the server overloads and
rate-limits on a schedule, the person drops persistent and one-off nudges and revokes one, and the client is
killed twice: once with a request in flight, once in the middle of an evaluation. A Dialect says how one API
carries the conversation; everything asserted about the journal and the final context is the same for all.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from workbench.agent.memory import SessionMemory
from workbench.journal import read_events
from workbench.session import SessionStore
from workbench.session.replay import load_state

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
FIRST_KILL_AT = 330
"""The first kill lands while the request made at this many tool calls is in flight."""


def good(i: int) -> str:
    return SEED + f"\n# rev {i}\n"


def bad(k: int, again: bool = False) -> str:
    """A variant that imports a banned library (a fast 'forbidden' verdict); each variant is its own change."""
    head = f"import torch\nimport flash_attn\n\nVARIANT = {k}\n"
    return SEED.replace("import torch\n", head) + f"\n# {'again ' if again else ''}variant {k}\n"


def call_for(i: int) -> tuple[str, dict[str, Any] | None]:
    """The scripted agent's i-th tool call (0-based): mostly cheap reads, a strategy per hundred calls that fails.

    None as arguments stands for a call whose argument JSON is malformed.
    """
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
        return "edit_kernel", None
    if r % 10 == 3:
        return "write_kernel", {"source": good(i), "note": f"rev {i}"}
    if r % 10 == 7:
        return "list_attempts", {"last": 5}
    if r % 10 == 8 and i > 20:
        return "diff_attempts", {"a": 1, "b": 2}
    if r % 10 == 9:
        return "show_best", {}
    return "read_kernel", {}


MALFORMED = '{"search": "x", "replace": '


@dataclass(frozen=True)
class Turn:
    """What the scripted model answers a request made after `n` tool calls: a fault, or text and calls."""

    fault: str | None = None
    """'overloaded' or 'rate_limited' (each with a short retry-after), else None."""
    text: str = ""
    calls: list[tuple[str, str, dict[str, Any] | None]] = field(default_factory=list)
    """(id, tool, arguments or None for malformed JSON)."""


def turn(n: int, index: int) -> Turn:
    """The scripted model's answer to the index-th request, made after n tool calls."""
    if index % 37 == 11:
        return Turn(fault="overloaded")
    if index % 53 == 17:
        return Turn(fault="rate_limited")
    if n >= TOTAL:
        return Turn(calls=[(f"toolu_{n:05d}", "finish", {"reason": "1,000 calls done"})])
    k = min(n // 100, len(IDEAS) - 1)
    calls = [(f"toolu_{i:05d}", *call_for(i)) for i in range(n, min(n + 1 + n % 3, TOTAL))]
    return Turn(text=f"Plan at {n}: keep the best correct kernel and explore {IDEAS[k]} next.", calls=calls)


def tool_calls_in(state: str) -> int:
    """The tool-call count a state block reports."""
    return int(re.search(r"tool_calls=(\d+)", state).group(1))


class Dialect(Protocol):
    """How one model API carries the conversation (request bodies and the scripted model's replies)."""

    key: str
    """The key the server wants; it must never reach the session folder or the output."""

    def server(self, script: Callable[[dict[str, Any], int], Any],
               on_request: Callable[[dict[str, Any], int], None]) -> Any:
        """The stand-in server (a context manager with `requests` and `base_url`)."""

    def env(self, server: Any) -> dict[str, str | None]:
        """Environment variables to set (None: to remove) so the client has the key and finds the server."""

    def run_args(self, server: Any) -> list[str]:
        """Extra `workbench run` arguments (the agent, the server)."""

    def reply(self, turn: Turn) -> Any:
        """The server's reply object for a scripted turn."""

    def is_reply(self, reply: Any) -> bool:
        """True for a successful reply (not a fault)."""

    def units(self, body: dict[str, Any]) -> list[Any]:
        """The conversation after the system prompt in comparable units: one per assistant reply and one per
        user turn (with its tool results), stripped of whatever moves every turn by design (cache breakpoints)."""

    def sent_reply(self, reply: Any) -> Any:
        """The unit by which the next request must carry that reply."""

    def system(self, body: dict[str, Any]) -> str:
        """The system prompt a request carries."""

    def summary(self, body: dict[str, Any]) -> str:
        """The text of the first turn after the system prompt (the compaction summary, once there is one)."""

    def state(self, body: dict[str, Any]) -> str:
        """The state block of a request's last user turn."""

    def all_text(self, body: dict[str, Any]) -> str:
        """Everything a request lets the model read."""

    def tell_text(self, body: dict[str, Any]) -> str:
        """The text of a request's last user turn (with its tool results)."""

    def last_call(self, reply: Any) -> str:
        """The tool name of a reply's last call."""


def _wait_for_intent(journal: Path, call_id: str, proc: subprocess.Popen, timeout: float = 240) -> None:
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


def _first_line(out: Any, proc: subprocess.Popen) -> str:
    for _ in range(600):
        out.seek(0)
        line = out.readline()
        if line.endswith("\n"):
            return line.strip()
        assert proc.poll() is None, "the run ended before printing its id: " + out.read()[-2000:]
        time.sleep(0.05)
    raise AssertionError("no session id printed")


def run(dialect: Dialect, tmp_path: Path) -> Path:
    """The whole acceptance run for one dialect, with its assertions and the figures it prints.

    Returns:
        The session folder, for what a dialect checks on top.
    """
    sessions, logs = tmp_path / "sessions", tmp_path / "logs"
    logs.mkdir()
    info: dict[str, Any] = {"id": None, "done": set(), "replies": {}, "arrivals": []}
    kill_now, killed = threading.Event(), threading.Event()

    def on_request(body: dict[str, Any], index: int) -> None:
        info["arrivals"].append((time.monotonic(), index))
        if not is_turn(body):
            return
        n = tool_calls_in(dialect.state(body))
        due = [name for at, (name, _, _) in NUDGES.items() if n >= at and name not in info["done"]]
        revoke = n >= REVOKE_AT and "revoke" not in info["done"]
        if info["id"] is not None and (due or revoke):  # opening the session reads its journal: only when needed
            reader = SessionStore(sessions).open(info["id"], writer=False)
            for at, (name, words, persistent) in NUDGES.items():
                if name in due:
                    info["done"].add(name)
                    reader.drop_nudge(words, persistent=persistent)
            if revoke:
                info["done"].add("revoke")
                target = next(e.data["id"] for e in reader.read_events()
                              if e.type == "nudge.received" and e.data["text"] == NUDGES[600][1])
                reader.drop_nudge(f"/revoke {target}", persistent=False)
        if n >= FIRST_KILL_AT and not kill_now.is_set():
            kill_now.set()  # the client dies with this request in flight
            killed.wait(60)

    def is_turn(body: dict[str, Any]) -> bool:
        return "<state>" in json.dumps(body)  # else a backend's check of the server before a run

    def script(body: dict[str, Any], index: int) -> Any:
        if not is_turn(body):
            return dialect.reply(turn(0, 0))
        reply = dialect.reply(turn(tool_calls_in(dialect.state(body)), index))
        info["replies"][index] = reply
        return reply

    def start(server: Any, *args: str) -> tuple[subprocess.Popen, Any]:
        out = open(logs / f"out{len(list(logs.iterdir()))}.txt", "w+")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "WORKBENCH_KERNELS": str(FIXTURES)}
        for name, value in dialect.env(server).items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        proc = subprocess.Popen([sys.executable, "-m", "workbench", *args, "--sessions-dir", str(sessions)],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        return proc, out

    started = time.monotonic()
    with dialect.server(script, on_request) as server:
        proc, out = start(server, "run", "tiny", *dialect.run_args(server), "--headless", "--device", "cpu",
                          "--context-budget", str(BUDGET), "--max-tool-calls", str(TOTAL + 50))
        info["id"] = _first_line(out, proc)
        assert kill_now.wait(240), "the first kill point was never reached"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        killed.set()

        resume_started = time.monotonic()
        proc, out = start(server, "resume", info["id"], "--headless")
        _wait_for_intent(sessions / info["id"] / "events.jsonl", f"c{KILLED_EVAL + 1:06d}", proc)
        resumed_first = next(t for t, i in info["arrivals"] if t > resume_started)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

        proc, out = start(server, "resume", info["id"], "--headless")
        assert proc.wait(300) == 0, (logs / "out2.txt").read_text()[-2000:]
    elapsed = time.monotonic() - started
    bodies = [b for i, b in enumerate(server.requests) if i in info["replies"]]
    replies = [info["replies"][i] for i in sorted(info["replies"])]

    folder = sessions / info["id"]
    events = list(read_events(folder / "events.jsonl"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    by_type: dict[str, list[Any]] = {}
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
    told = [b for b in bodies if f"toolu_{KILLED_EVAL:05d}" in dialect.tell_text(b)]
    assert told and "interrupted: the process ended" in dialect.tell_text(told[0])

    # several compactions, each audited: goal, failed strategies, best result and persistent nudges survived
    compactions = by_type["memory.compacted"]
    assert len(compactions) >= 3 and all(c.data["audit"]["ok"] for c in compactions)
    # the context stayed under its budget on every turn
    requests = by_type["llm.request"]
    assert max(r.data["context_tokens"] for r in requests) <= BUDGET

    # every request either re-sends the previous one, or keeps its history and adds the reply and one delta,
    # or starts from a fresh compaction summary followed by a suffix of that history: across both kills too
    resends = extends = compacted = 0
    for i, (b1, b2) in enumerate(zip(bodies, bodies[1:])):
        u1, u2 = dialect.units(b1), dialect.units(b2)
        if u2 == u1:
            resends += 1
            continue
        assert dialect.is_reply(replies[i]), f"request {i + 1} follows a failed request {i} without re-sending it"
        assert u2[-2] == dialect.sent_reply(replies[i]), f"request {i + 1} does not carry the reply to request {i}"
        if u2[:-2] == u1:
            extends += 1
        else:
            assert dialect.summary(b2).startswith("MEMORY (compaction #"), f"request {i + 1}"
            history = u1 + [u2[-2]]
            kept = u2[1:-1]
            assert history[len(history) - len(kept):] == kept, f"request {i + 1} kept something new"
            compacted += 1
    assert compacted == len(compactions) and resends >= 2 and extends > 300

    final = bodies[-1]
    assert dialect.last_call(replies[-1]) == "finish"
    system = dialect.system(final)
    assert "GOAL CONTRACT" in system and "task: tiny" in system and "rel_rms <= 1e-06" in system
    everything, state = dialect.all_text(final), dialect.state(final)
    ledger = by_type["ledger.updated"][-1].data["ledger"]
    failed = [e for e in ledger if e["status"] == "failed"]
    assert len(failed) == len(IDEAS)
    for entry in failed:
        line = f"{entry['id']} [failed] {entry['strategy']}"
        assert line in state and line in everything
    summary = dialect.summary(final)
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
            assert dialect.key.encode() not in data and b"Bearer" not in data, path

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
          f"{len(compactions)} compactions, {len(server.requests)} HTTP requests, wall {elapsed:.1f} s")
    print(f"resume: state + memory rebuilt in {load_s * 1000:.0f} ms in-process; "
          f"CLI resume to first request {resumed_first - resume_started:.2f} s")
    print("\n".join(rows))
    assert load_s < 2.0
    return folder
