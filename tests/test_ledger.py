"""The strategy ledger: entries, evidence, and the "already tried" warning before an evaluation."""

import threading
from types import SimpleNamespace

import pytest

from workbench.agent import ledger
from workbench.agent.backends.base import Finish, StepBackend, ToolCall
from workbench.agent.budget import Budget
from workbench.agent.runtime import AgentRuntime
from workbench.agent.evaluation import FunctionEvaluator
from workbench.session.revisions import sha256_text
from workbench.session import SessionStore
from workbench.session.state import Attempt, SessionState

BASE = """import torch


def forward(x):
    y = x * 2.0
    return y
"""
TILED = BASE.replace("    y = x * 2.0\n", "    t = x.view(-1, 4)\n    y = (t * 2.0).view(-1)\n")


def attempt(n, source, parent=None, note="", strategy=None, verdict="incorrect", message="rel_err 0.3 > 1e-6"):
    return Attempt(n=n, sha256=sha256_text(source), author="agent", parent=parent, note=note, source=source,
                   params={"strategy": strategy} if strategy else {}, verdict=verdict, message=message)


def session(*attempts, entries=()):
    state = SessionState()
    for a in attempts:
        state.attempts[a.n] = a
    state.ledger = list(entries)
    return state


def test_add_update_and_ids_are_never_reused():
    book, s1 = ledger.add([], {"strategy": "tile by 4", "expected": "+20%"})
    book, s2 = ledger.add(book, {"strategy": "fp16 accumulate", "status": "trying"})
    assert (s1["id"], s1["status"], s2["id"]) == ("S1", "planned", "S2")
    book, s1b = ledger.update(book, "s1", {"status": "failed", "why": "misaligned loads", "actual": "-10%"})
    assert s1b["status"] == "failed" and book[0] is s1b and book[1] is s2
    book, s3 = ledger.add(book, {"strategy": "vectorised loads"})
    assert s3["id"] == "S3"
    assert [e["id"] for e in ledger.failed(book)] == ["S1"]
    with pytest.raises(ledger.LedgerError, match="already records"):
        ledger.add(book, {"strategy": "Tile  by 4"})
    with pytest.raises(ledger.LedgerError, match="status must be one of"):
        ledger.update(book, "S2", {"status": "great"})
    with pytest.raises(ledger.LedgerError, match="no strategy 'S9'"):
        ledger.update(book, "S9", {"status": "failed"})
    with pytest.raises(ledger.LedgerError, match="give status"):
        ledger.update(book, "S2", {})
    with pytest.raises(ledger.LedgerError, match="one-line"):
        ledger.add(book, {"strategy": "   "})


def test_attempts_must_exist_and_evidence_freezes_what_they_showed():
    state = session(attempt(1, BASE, verdict="ok", message=""), attempt(2, TILED, parent=1))
    state.attempts[1].speedup = 1.25
    book, entry = ledger.add([], {"strategy": "tile", "attempts": [2, 1, 2]}, state)
    assert entry["attempts"] == [2, 1]
    assert entry["evidence"][1] == {"attempt": 1, "verdict": "ok", "speedup": 1.25}
    assert "rel_err" in entry["evidence"][0]["message"]
    with pytest.raises(ledger.LedgerError, match="attempt 7 does not exist"):
        ledger.update(book, "S1", {"attempts": [7]}, state)
    with pytest.raises(ledger.LedgerError, match="attempt numbers"):
        ledger.add([], {"strategy": "x", "attempts": ["2"]}, state)
    linked = ledger.link(book, "S1", state.attempts[2])
    assert linked[0]["attempts"] == [2, 1] and len(linked[0]["evidence"]) == 2  # refreshed, not duplicated
    assert ledger.link(book, "S5", state.attempts[2]) is None
    assert "#2 incorrect" in ledger.line(linked[0]) and "#1 ok 1.25x" in ledger.line(linked[0])


def failed_tiling(state_attempts):
    book, _ = ledger.add([], {"strategy": "tile rows by 4 with a view", "status": "failed",
                              "why": "wrong results on odd sizes", "attempts": [2]},
                         session(*state_attempts))
    return book


def test_tag_rule_names_the_strategy_and_its_evidence():
    base, failing = attempt(1, BASE, verdict="ok", message=""), attempt(2, TILED, parent=1)
    book = failed_tiling([base, failing])
    new = attempt(3, BASE.replace("2.0", "2.00"), parent=1, strategy="S1", verdict=None)
    warnings = ledger.find_repeats(session(base, failing, new, entries=book), new)
    assert [w["rule"] for w in warnings] == ["tag"]
    message = warnings[0]["message"]
    assert "S1" in message and "FAILED" in message and "#2 incorrect" in message and "odd sizes" in message


def test_code_rule_catches_the_same_change_on_another_base_but_not_a_fix_of_it():
    base, failing = attempt(1, BASE, verdict="ok", message=""), attempt(2, TILED, parent=1)
    book = failed_tiling([base, failing])
    other_base = attempt(3, BASE.replace("import torch\n", "import torch\nimport math\n"), parent=1,
                         verdict="ok", message="")
    # the same tiling edit, re-applied to attempt 3 (different source, different sha)
    again = attempt(4, TILED.replace("import torch\n", "import torch\nimport math\n"), parent=3, verdict=None)
    state = session(base, failing, other_base, again, entries=book)
    warnings = ledger.find_repeats(state, again)
    assert [w["rule"] for w in warnings] == ["code"]
    assert "re-applies 2 of the 2 lines attempt 2 added" in warnings[0]["message"]
    # a child of the failed attempt that fixes it adds new lines only: no warning
    fix = attempt(5, TILED.replace("t = x.view(-1, 4)", "t = x.reshape(-1, 1)"), parent=2, verdict=None)
    state.attempts[5] = fix
    assert ledger.find_repeats(state, fix) == []
    # an identical source always matches
    clone = attempt(6, TILED, parent=3, verdict=None)
    state.attempts[6] = clone
    assert "same code as attempt 2" in ledger.find_repeats(state, clone)[0]["message"]
    # ... and so does the failed code with only comments or spacing changed
    recomment = attempt(7, TILED.replace("    y = (t", "    # retry\n    y  =  (t").replace("y  =  (t", "y = (t"),
                        parent=2, verdict=None)
    state.attempts[7] = recomment
    assert "same code as attempt 2" in ledger.find_repeats(state, recomment)[0]["message"]


def test_text_rule_and_only_failed_strategies_warn():
    base, failing = attempt(1, BASE, verdict="ok", message=""), attempt(2, TILED, parent=1)
    book = failed_tiling([base, failing])
    unrelated = attempt(3, BASE.replace("2.0", "2.0 * 1"), parent=1, note="tile the rows by 4 again", verdict=None)
    state = session(base, failing, unrelated, entries=book)
    assert [w["rule"] for w in ledger.find_repeats(state, unrelated)] == ["text"]
    unrelated.note = "scale in fp64"
    assert ledger.find_repeats(state, unrelated) == []
    book, _ = ledger.update(book, "S1", {"status": "dropped"})
    state.ledger = book
    unrelated.note = "tile the rows by 4 again"
    assert ledger.find_repeats(state, unrelated) == []


class Scripted(StepBackend):
    """A backend that plays a fixed list of tool calls, then finishes."""

    name = "scripted"

    def __init__(self, calls, seed=BASE):
        super().__init__(seed)
        self.calls = list(calls)

    def next_action(self, state, task):
        return self.calls.pop(0) if self.calls else Finish("script done")

    def acknowledge(self, nudge, state, task):
        return "noted"


def test_evaluate_refuses_a_repeat_of_a_failed_strategy_until_forced(tmp_path):
    evaluated = []

    def evaluator(task, path, device, **kw):
        evaluated.append(path.read_text())
        return {"verdict": "incorrect", "message": "rel_err 0.5", "speedup": None, "shapes": [],
                "timing_comparable": False}

    calls = [
        ToolCall("ledger", {"action": "add", "strategy": "tile rows by 4 with a view"}),
        ToolCall("write_kernel", {"source": TILED, "strategy": "S1", "note": "tiling"}),
        ToolCall("evaluate", {}),
        ToolCall("ledger", {"action": "update", "id": "S1", "status": "failed", "why": "odd sizes break"}),
        ToolCall("write_kernel", {"source": TILED + "\n# again\n", "parent": 2, "note": "retry"}),
        ToolCall("evaluate", {}),
        ToolCall("evaluate", {"force": True}),
    ]
    files = SessionStore(tmp_path).create(task="toy", agent="scripted", model=None, device="cpu", budget={})
    rt = AgentRuntime(files, SessionState(), SimpleNamespace(name="toy", public_view=dict), Scripted(calls),
                      device="cpu", budget=Budget(), evaluator=FunctionEvaluator(evaluator))
    rt.run(threading.Event())
    results = [e.data for e in files.read_events() if e.type == "tool.result"]
    write_again, refused, forced = results[4], results[5], results[6]
    assert "already FAILED" in write_again["data"]["warnings"][0]["message"]
    assert not refused["ok"] and "not evaluated" in refused["error"] and "force=true" in refused["error"]
    assert "#2 incorrect" in refused["error"]  # attempt 1 is the starting kernel, BASE
    assert forced["ok"] and forced["data"]["forced_past"] == ["S1"]
    assert len(evaluated) == 2  # the refused call never reached the evaluator
    # evaluating a tagged attempt links it to its strategy as evidence
    assert rt.state.ledger[0]["attempts"] == [2]
    assert rt.state.ledger[0]["evidence"][0]["verdict"] == "incorrect"
    files.close()
