"""Working memory: the window as a fold of the journal, compaction cuts, the summary and its audit."""

import threading

from test_runtime import SEED, TASK, fake_evaluator
from workbench.agent.backends.tuner import TunerBackend
from workbench.agent.budget import Budget
from workbench.agent.context import context_at
from workbench.agent.evaluation import FunctionEvaluator
from workbench.agent.memory import SessionMemory, audit, estimate_tokens, plan_compaction, summarize
from workbench.agent.runtime import AgentRuntime
from workbench.session import SessionStore
from workbench.session.replay import load_state
from workbench.session.state import SessionState, apply


class Log:
    """Builds journal records by hand and folds them into a state and a messages-kind memory."""

    def __init__(self):
        self.records, self.state, self.memory = [], SessionState(), SessionMemory("messages")

    def add(self, kind, data):
        record = {"seq": len(self.records) + 1, "ts": "2026-01-01T00:00:00.000Z", "type": kind, "data": data}
        self.records.append(record)
        apply(self.state, record)
        self.memory.apply(record)
        return record

    def turn(self, k, words=200):
        self.add("llm.request", {"turn": k, "delta": [{"role": "user", "content": [
            {"type": "text", "text": f"results of turn {k - 1} " + "x " * words}]}]})
        self.add("llm.response", {"ok": True, "turn": k, "content": [
            {"type": "text", "text": f"plan {k}: tile the loop"},
            {"type": "tool_use", "id": f"t{k}", "name": "read_kernel", "input": {"attempt": k}}]})
        self.add("tool.call", {"call_id": f"c{k}", "tool": "read_kernel", "args": {}, "ref": f"t{k}"})
        self.add("tool.result", {"call_id": f"c{k}", "tool": "read_kernel", "ok": True, "summary": "ok", "data": {}})


def rich_log(turns=12):
    log = Log()
    log.add("goal.set", {"name": "toy", "description": "double it"})
    log.add("attempt.written", {"attempt": 1, "sha256": "a", "source": "def forward(x):\n    return 2 * x\n",
                                "note": "seed"})
    log.add("eval.finished", {"attempt": 1, "result": {"verdict": "ok", "speedup": 1.4, "shapes": [],
                                                       "timing_comparable": True}})
    log.add("attempt.written", {"attempt": 2, "parent": 1, "sha256": "b", "source": "bad", "note": "tl.dot bf16"})
    log.add("eval.finished", {"attempt": 2, "result": {"verdict": "incorrect", "message": "rel_err 0.2 on C3"}})
    log.add("ledger.updated", {"ledger": [
        {"id": "S1", "strategy": "tl.dot in bf16 for the inner product", "status": "failed", "why": "precision",
         "attempts": [2], "evidence": [{"attempt": 2, "verdict": "incorrect"}]},
        {"id": "S2", "strategy": "two rows per program", "status": "planned", "attempts": [], "evidence": []}]})
    log.add("nudge.received", {"id": "n1", "text": "Keep the accumulator in fp32, always.", "persistent": True})
    log.add("nudge.acked", {"id": "n1", "note": "queued"})
    log.add("nudge.received", {"id": "n2", "text": "look at S2 next", "persistent": False})
    log.add("nudge.acked", {"id": "n2", "note": "queued"})
    for k in range(1, turns + 1):
        log.turn(k)
    return log


def test_the_window_is_the_fold_of_requests_and_replies():
    log = rich_log(3)
    memory = log.memory
    assert [e.role for e in memory.entries] == ["user", "assistant"] * 3
    assert memory.turn == 3 and not memory.pending and memory.response["seq"] == log.records[-3]["seq"]
    assert memory.calls["t3"]["result"]["ok"] and memory.silent == 0
    assert memory.tokens() == sum(estimate_tokens(e.content) for e in memory.entries)
    log.add("llm.request", {"turn": 4, "delta": [{"role": "user", "content": [{"type": "text", "text": "go"}]}]})
    assert memory.pending and memory.calls["t3"]  # calls belong to the reply until the next reply arrives
    log.add("llm.response", {"ok": False, "turn": 4, "error": "529 overloaded_error", "retry_in": 1.0})
    assert memory.pending and len(memory.entries) == 7  # a failed try adds nothing to the conversation


def test_compaction_keeps_the_latest_reply_and_a_summary_that_passes_the_audit():
    log = rich_log(12)
    memory, state = log.memory, log.state
    before = memory.tokens()
    data = plan_compaction(memory, state, limit=before // 2, overhead=0)
    assert data is not None and data["audit"]["ok"]
    assert data["audit"]["failed_strategies"] == {"S1": True} and data["audit"]["persistent_nudges"] == {"n1": True}
    assert data["replaced"][0] == 1 and data["entries_dropped"] > 0
    assert data["tokens_after"] < data["tokens_before"] <= before
    summary = data["summary"]
    for needle in ("best: attempt 1", "S1 [failed] tl.dot in bf16", "why: precision", "Keep the accumulator in fp32",
                   "#2 incorrect: rel_err 0.2 on C3", "S2 [planned]"):
        assert needle in summary
    assert "look at S2 next" not in summary  # a one-off nudge was delivered; only persistent ones are kept
    assert data["plan"].startswith("plan ") and any(line.startswith("turn 1 @") for line in data["dropped"])
    log.add("memory.compacted", data)
    # the kept window starts with a model reply (after the summary), and the latest reply is still there
    assert memory.entries[0].role == "assistant" and memory.entries[-1].seq == memory.response["seq"]
    assert memory.summary == summary and memory.compactions == 1
    # a second compaction replaces from just after the first one and subsumes it
    for k in range(13, 20):
        log.turn(k)
    second = plan_compaction(memory, state, limit=memory.tokens() // 2, overhead=0)
    assert second["replaced"][0] == data["replaced"][1] + 1 and second["number"] == 2 and second["audit"]["ok"]


def test_audit_reports_what_a_summary_lost():
    log = rich_log(2)
    summary = summarize(log.state, "p")
    assert audit(summary, log.state)["ok"]
    broken = audit(summary.replace("Keep the accumulator in fp32, always.", "").replace("S1 [failed]", "S1"),
                   log.state)
    assert not broken["ok"] and broken["failed_strategies"] == {"S1": False}
    assert broken["persistent_nudges"] == {"n1": False}


def test_no_compaction_under_budget_or_without_anything_to_drop():
    log = rich_log(0)
    log.add("llm.request", {"turn": 1, "delta": [{"role": "user", "content": [{"type": "text", "text": "x" * 9000}]}]})
    # over budget, but there is no reply yet: the pending request must stay whole
    assert plan_compaction(log.memory, log.state, limit=1, overhead=0) is None
    log.add("llm.response", {"ok": True, "turn": 1, "content": [{"type": "text", "text": "thinking"}]})
    assert plan_compaction(log.memory, log.state, limit=10**6, overhead=0) is None
    # over budget with one reply: the big user turn before it goes, the latest reply stays
    data = plan_compaction(log.memory, log.state, limit=1, overhead=0)
    assert data["entries_dropped"] == 1 and data["replaced"][1] == log.records[-1]["seq"] - 1


def test_the_tuner_compacts_through_the_same_mechanism_and_resume_rebuilds_the_window(tmp_path):
    budget = Budget(max_iterations=10, context_tokens=500)
    files = SessionStore(tmp_path).create(task="toy", agent="tuner", model=None, device="cpu", budget={})
    runtime = AgentRuntime(files, SessionState(), TASK, TunerBackend(SEED), device="cpu", budget=budget,
                           evaluator=FunctionEvaluator(fake_evaluator()), checkpoint_every=7)
    runtime.emit("session.created", {"id": files.id, "task": "toy", "agent": "tuner", "budget": {}})
    runtime.emit("goal.set", {"name": "toy", "description": "identity, tuned"})
    runtime.run(threading.Event())
    events = [e for e in files.read_events() if e.type == "memory.compacted"]
    assert len(events) >= 2 and all(e.data["audit"]["ok"] and e.data["kind"] == "tools" for e in events)
    assert all(e.data["tokens_after"] <= 500 for e in events)
    assert "best: attempt" in runtime.memory.summary
    live = [(e.seq, e.role, e.content) for e in runtime.memory.entries]
    files.close()

    files = SessionStore(tmp_path).open(files.id, writer=False)
    state = load_state(files)
    rebuilt = SessionMemory.load(files, state, "tools")
    assert [(e.seq, e.role, e.content) for e in rebuilt.entries] == live
    assert rebuilt.summary == runtime.memory.summary
    # the memory at any seq is the fold of the journal up to it
    _, at, _ = context_at(files.read_events(), events[0].seq)
    assert at.summary == events[0].data["summary"]
    assert all(e.seq > events[0].data["replaced"][1] for e in at.entries)
