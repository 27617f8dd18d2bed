"""The runtime's collaborators on their own: the command desk, the working copy, evaluations (and their journal
cache), checkpoints, and a tool run against a hand-built ToolContext."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from workbench.agent.backends.base import Finish, StepBackend, ToolCall
from workbench.agent.budget import Budget
from workbench.agent.checkpoints import Checkpoints
from workbench.agent.commands import Command, CommandDesk
from workbench.agent.edits import WorkingCopy, WorkingCopyError
from workbench.agent.evaluation import Evaluations, FunctionEvaluator
from workbench.agent.runtime import AgentRuntime
from workbench.agent.sink import NullSink
from workbench.agent.slots import evaluator_pool
from workbench.agent.tools import TOOLS, ToolContext, ToolError, render_result
from workbench.journal import Event
from workbench.session import SessionStore
from workbench.session.revisions import sha256_text
from workbench.session.state import SessionState, apply

SEED = 'TUNABLES = {"B": [1, 2]}\nCONFIG = {"B": 1}\n\n\ndef forward(x):\n    return x\n'


class Log:
    """An emit that folds into a state, as the runtime's does (without a journal on disk)."""

    def __init__(self) -> None:
        self.state = SessionState()
        self.events: list[Event] = []

    def emit(self, type: str, data: dict[str, Any]) -> Event:
        event = Event(len(self.events) + 1, datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"), type,
                      data, "")
        self.events.append(event)
        apply(self.state, event.to_dict())
        return event

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def attempt(self, source: str, parent: int | None = None) -> int:
        n = self.state.next_attempt
        self.emit("attempt.written", {"attempt": n, "parent": parent, "sha256": sha256_text(source),
                                      "author": "agent", "note": "", "params": {}, "source": source})
        return n


# -- the command desk ----------------------------------------------------------------------------------------
class Sink(NullSink):
    def __init__(self) -> None:
        self.asked: list[Future[str]] = []

    def ask(self, question: str) -> Future[str]:
        future: Future[str] = Future()
        self.asked.append(future)
        return future


def desk(log: Log, inbox: list[dict[str, Any]] | None = None) -> CommandDesk:
    waiting = list(inbox or [])

    def take_inbox(record):
        taken = []
        while waiting:
            item = waiting.pop(0)
            if "error" not in item:
                record(item)
            taken.append(item)
        return taken

    return CommandDesk(state=log.state, emit=log.emit, acknowledge=lambda nudge: f"ok: {nudge['text']}",
                       take_inbox=take_inbox)


def test_the_desk_journals_nudges_pauses_and_revokes_and_hands_back_profile_requests():
    log = Log()
    commands: queue.Queue[Command] = queue.Queue()
    for command in (Command("nudge", "use fp32 accumulators", persistent=True), Command("pause"), Command("pause"),
                    Command("profile"), Command("resume")):
        commands.put(command)
    d = desk(log)
    assert [c.kind for c in d.take(commands)] == ["profile"]
    assert log.types() == ["nudge.received", "nudge.acked", "run.paused", "run.resumed"]
    assert log.events[1].data["note"] == "ok: use fp32 accumulators" and not d.paused
    nudge_id = log.state.nudges[0]["id"]
    commands.put(Command("revoke", "zz"))
    commands.put(Command("revoke", nudge_id[:3]))
    d.take(commands)
    assert "matches no persistent nudge in force" in log.events[-2].data["message"]
    assert log.events[-1].data == {"id": nudge_id, "revoked": True, "note": "revoked by the person"}
    assert not log.state.active_nudges()


def test_the_desk_reads_the_inbox_including_revokes_and_reports_bad_files():
    log = Log()
    log.emit("nudge.received", {"id": "p1", "text": "keep it exact", "persistent": True})
    log.emit("nudge.acked", {"id": "p1", "note": "ok"})
    d = desk(log, [{"text": "one-off hint", "persistent": False}, {"text": "/revoke p1"},
                   {"id": "x", "error": "x.json: not a nudge (not JSON)"}])
    d.take(queue.Queue())
    assert [e.type for e in log.events[2:]] == ["nudge.received", "nudge.acked", "nudge.acked", "error"]
    assert log.events[2].data["origin"] == "inbox" and log.events[4].data["revoked"]
    assert log.events[5].data["message"] == "inbox: x.json: not a nudge (not JSON)"


def test_answers_to_questions_arrive_as_one_off_nudges_at_the_next_boundary():
    log = Log()
    d = desk(log)
    sink = Sink()
    d.sink = sink
    assert d.ask("BLOCK 256?", "c000001") and d.ask("stop now?", "c000002")
    d.take(queue.Queue())
    assert log.events == [], "nothing until the person answers"
    sink.asked[0].set_result("yes, try it")
    sink.asked[1].cancel()
    d.take(queue.Queue())
    texts = [e.data["text"] for e in log.events if e.type == "nudge.received"]
    assert texts == ['Answer to your question "BLOCK 256?": yes, try it',
                     "The person declined to answer your question: stop now?"]
    d.sink = NullSink()  # nobody watches: the question is answered at once, by a cancelled future
    assert not d.ask("anyone?", "c000003")


# -- the working copy ----------------------------------------------------------------------------------------
def test_a_persons_edit_is_taken_and_the_runtimes_own_copy_is_not(tmp_path: Path):
    log = Log()
    log.attempt(SEED)
    copy = WorkingCopy(tmp_path / "kernel.py", log.state)
    assert copy.take(log.state) is None and (tmp_path / "kernel.py").read_text() == SEED, "a missing file is made"
    edited = SEED.replace('"B": 1}', '"B": 2}')
    (tmp_path / "kernel.py").write_text(edited)
    edit = copy.take(log.state)
    assert edit is not None and edit.source == edited and edit.params == {"B": 2}
    (tmp_path / "kernel.py").write_text("")  # an editor half-way through its save
    assert copy.take(log.state) is None and (tmp_path / "kernel.py").read_text() == ""
    (tmp_path / "kernel.py").write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(WorkingCopyError, match="unreadable"):
        copy.take(log.state)


def test_an_edit_saved_mid_step_is_not_overwritten_by_the_next_attempt(tmp_path: Path):
    log = Log()
    copy = WorkingCopy(tmp_path / "kernel.py", log.state)
    log.attempt(SEED)
    copy.write(SEED)
    assert copy.take(log.state) is None
    mine = SEED + "# mine\n"
    (tmp_path / "kernel.py").write_text(mine)  # saved after the boundary look, before the agent's next write
    second = SEED.replace('"B": 1}', '"B": 2}')
    log.attempt(second, parent=1)
    copy.write(second)
    assert (tmp_path / "kernel.py").read_text() == mine
    edit = copy.take(log.state)
    assert edit is not None and edit.source == mine


def test_after_a_crash_the_stale_copy_is_restored_but_going_back_to_an_older_attempt_is_an_edit(tmp_path: Path):
    log = Log()
    first, second, third = SEED, SEED + "# 2\n", SEED + "# 3\n"
    for n, source in enumerate((first, second, third)):
        log.attempt(source, parent=n or None)
    (tmp_path / "kernel.py").write_text(second)  # killed between journaling attempt 3 and rewriting kernel.py
    copy = WorkingCopy(tmp_path / "kernel.py", log.state)
    assert copy.take(log.state) is None and (tmp_path / "kernel.py").read_text() == third
    (tmp_path / "kernel.py").write_text(first)  # the person goes back to attempt 1: build on that
    edit = copy.take(log.state)
    assert edit is not None and edit.source == first


# -- evaluations -----------------------------------------------------------------------------------------------
class Counting:
    """An Evaluator that counts its calls and is closed once."""

    def __init__(self, verdict: str = "ok") -> None:
        self.calls: list[tuple[str, bool]] = []
        self.closed = 0
        self.verdict = verdict

    def evaluate(self, task, path, *, heldout=False):
        self.calls.append((Path(path).read_text(), heldout))
        result = {"verdict": self.verdict, "message": "", "speedup": 1.5, "timing_comparable": False,
                  "shapes": [{"name": "C1", "correct": True, "ms": 0.2, "speedup": 1.5}]}
        if heldout:
            result["heldout"] = [{"name": "H1", "correct": True}]
        return result

    def close(self):
        self.closed += 1


def evaluations(tmp_path: Path, evaluator) -> tuple[Evaluations, Log, Any]:
    files = SessionStore(tmp_path).create(task="toy", agent="scripted", model=None, device="cpu", budget={})
    log = Log()

    def path_of(n: int) -> Path:
        if not files.attempt_dir(n).exists():
            files.write_attempt(n, kernel=log.state.attempts[n].source, parent_kernel=None, parent=None)
        return files.attempt_dir(n) / "kernel.py"

    task = SimpleNamespace(name="toy")
    return Evaluations(evaluator_pool([evaluator], task), task=task, state=log.state, files=files, emit=log.emit,
                       attempt_path=path_of), log, files


def test_an_evaluated_source_is_answered_from_the_journal_unless_forced(tmp_path: Path):
    evaluator = Counting()
    evals, log, files = evaluations(tmp_path, evaluator)
    n = log.attempt(SEED)
    first = evals.evaluate(n)
    assert first.cached_seq is None and evaluator.calls == [(SEED, False), (SEED, True)], "a new best: held-out too"
    assert (files.attempt_dir(n) / "result.json").exists() and (files.dir / "heldout" / "0001.json").exists()
    again = evals.evaluate(n)
    assert again.cached_seq == log.state.attempts[n].eval_seq and len(evaluator.calls) == 2
    assert again.result["verdict"] == "ok" and again.result["shapes"] == first.result["shapes"]
    twin = log.attempt(SEED)  # another attempt with the very same text
    assert evals.evaluate(twin).cached_seq is not None and len(evaluator.calls) == 2
    assert evals.evaluate(n, force=True).cached_seq is None and len(evaluator.calls) == 3
    evals.close()
    assert evaluator.closed == 1
    files.close()


def test_a_function_evaluator_gets_the_device_and_the_held_out_flag():
    seen = []
    evaluator = FunctionEvaluator(lambda task, path, device, heldout: seen.append((device, heldout)) or {}, "cuda")
    evaluator.evaluate(None, Path("k.py"))
    evaluator.evaluate(None, Path("k.py"), heldout=True)
    assert seen == [("cuda", False), ("cuda", True)]


class Scripted(StepBackend):
    name = "scripted"

    def __init__(self, calls: list[ToolCall]) -> None:
        super().__init__(SEED)
        self.calls = list(calls)

    def next_action(self, state, task):
        return self.calls.pop(0) if self.calls else Finish("script done")

    def acknowledge(self, nudge, state, task):
        return "noted"


def test_the_evaluate_tool_tells_the_agent_plainly_when_nothing_ran(tmp_path: Path):
    evaluator = Counting(verdict="incorrect")
    files = SessionStore(tmp_path).create(task="toy", agent="scripted", model=None, device="cpu", budget={})
    calls = [ToolCall("evaluate", {"source": SEED}), ToolCall("evaluate", {}), ToolCall("evaluate", {"source": SEED}),
             ToolCall("evaluate", {"force": True}), ToolCall("write_kernel", {"source": SEED})]
    rt = AgentRuntime(files, SessionState(), SimpleNamespace(name="toy"), Scripted(calls), device="cpu",
                      budget=Budget(), evaluator=evaluator)
    rt.run(threading.Event())
    results = [e.data for e in files.read_events() if e.type == "tool.result"]
    assert [r["ok"] for r in results] == [True, True, True, True, False]
    assert "cached" not in results[0]["data"] and "from the journal" not in results[0]["summary"]
    first_eval = next(e.seq for e in files.read_events() if e.type == "eval.finished")
    for cached in results[1:3]:
        assert "nothing was run" in cached["summary"] and "force=true runs it again" in cached["summary"]
        assert cached["data"]["cached"] == first_eval
    assert "cached" not in results[3]["data"]
    assert sorted(rt.state.attempts) == [1], "an identical source is no new attempt"
    assert [heldout for _, heldout in evaluator.calls] == [False, False], "run once, then once more when forced"
    assert "identical to attempt 1" in results[4]["error"]
    # what the model reads of a cached result says so too
    content, is_error = render_result({"tool": "evaluate"}, results[1], rt.state)
    assert not is_error and "nothing was run" in content[0]["text"] and "verdict: incorrect" in content[0]["text"]
    files.close()


def test_the_tuner_never_evaluates_a_config_whose_source_it_already_has():
    from workbench.agent.backends.tuner import TunerBackend
    from workbench.agent.tunables import with_config

    log = Log()
    log.emit("attempt.written", {"attempt": 1, "sha256": sha256_text(SEED), "params": {"B": 1}, "source": SEED})
    log.emit("eval.finished", {"attempt": 1, "result": {"verdict": "ok", "speedup": 1.0, "shapes": []}})
    tuner = TunerBackend(SEED)
    action = tuner.next_action(log.state, None)
    assert isinstance(action, ToolCall) and action.args["source"] == with_config(SEED, {"B": 2})
    # An attempt with that very text under other params (the evaluate tool would answer it from the journal, so
    # proposing it again would never end): the tuner counts it as tried.
    log.emit("attempt.written", {"attempt": 2, "sha256": sha256_text(action.args["source"]), "params": {},
                                 "source": action.args["source"], "author": "human"})
    log.emit("eval.finished", {"attempt": 2, "result": {"verdict": "ok", "speedup": 0.5, "shapes": []}})
    assert tuner.next_action(log.state, None) == Finish("search space exhausted")


# -- checkpoints and the tool context ---------------------------------------------------------------------------
def test_checkpoints_are_due_every_so_many_events_and_journaled(tmp_path: Path):
    files = SessionStore(tmp_path).create(task="toy", agent="tuner", model=None, device="cpu", budget={})
    state = SessionState()

    def emit(type: str, data: dict[str, Any]) -> Event:
        event = files.journal.append(type, data)
        apply(state, event.to_dict())
        return event

    points = Checkpoints(files, emit, every=3, last_seq=0)
    emit("session.created", {"id": files.id, "task": "toy", "agent": "tuner"})
    emit("error", {"message": "one"})
    assert not points.due(state)
    emit("error", {"message": "two"})
    assert points.due(state)
    points.write(state)
    assert points.last_seq == state.last_seq == 4 and not points.due(state)
    assert files.meta["checkpoint_seq"] == 3 and files.meta["state"]["errors"] == ["one", "two"]
    files.close()


def test_a_tool_runs_against_a_hand_built_context_without_a_runtime(tmp_path: Path):
    log = Log()
    written = []

    def write_attempt(source, *, note, params, parent):
        written.append(source)
        return log.attempt(source, parent)

    ctx = ToolContext(state=log.state, task=SimpleNamespace(name="toy", dir=tmp_path), device="cpu",
                      seed_source=SEED, session_dir=tmp_path, emit=log.emit, write_attempt=write_attempt,
                      evaluate=lambda n, force=False: pytest.fail("not asked to evaluate"),
                      final=lambda n: pytest.fail("not asked about results"),
                      attempt_path=lambda n: tmp_path / "k.py", ask=lambda question: False)
    outcome = TOOLS["edit_kernel"].run(ctx, {"search": '"B": 1}', "replace": '"B": 2}'})
    assert outcome.data == {"attempt": 1, "parent": None, "warnings": []} and written == [SEED.replace("1}", "2}")]
    assert "from the seed, 2 lines changed" in outcome.summary
    with pytest.raises(ToolError, match="no attempt 7"):
        TOOLS["read_kernel"].run(ctx, {"attempt": 7})
