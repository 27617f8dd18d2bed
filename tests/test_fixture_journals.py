"""Journals written by main before the contracts refactor still open, replay, render and resume the same way.

The sessions under fixtures/journals/ were written by main at f9b3639 through the real CLI
(fixtures/journals/make_journals.py); golden/<name>.json holds what that code showed of them. Every test here
reads those bytes with today's code.
"""

from __future__ import annotations

import io
import json
import queue
import shutil
import threading
from pathlib import Path

import pytest

from workbench import cli
from workbench.agent.budget import Budget
from workbench.agent.headless import HeadlessSink
from workbench.journal import read_events
from workbench.session import SessionStore
from workbench.session.replay import load_state
from workbench.session.state import SessionState, apply, fold
from workbench.ui.formatting import event_summary
from workbench.ui.history import load_history

HERE = Path(__file__).resolve().parent
JOURNALS = HERE / "fixtures" / "journals"
TASKS = HERE / "fixtures" / "tasks"
NAMES = ("tuner", "claude", "killed")


def golden(name: str) -> dict:
    return json.loads((JOURNALS / "golden" / f"{name}.json").read_text())


@pytest.fixture
def sessions(tmp_path: Path) -> Path:
    """A copy of the fixture sessions: resuming writes to them, and the committed bytes must stay as they are."""
    target = tmp_path / "sessions"
    shutil.copytree(JOURNALS / "sessions", target)
    return target


def show(capsys, *args: str) -> str:
    assert cli.main(["show", *args]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", NAMES)
def test_show_json_of_an_old_journal_is_unchanged(name, sessions, capsys):
    expected = golden(name)
    assert json.loads(show(capsys, expected["id"], "--json", "--sessions-dir", str(sessions))) == expected["show"]


@pytest.mark.parametrize("name", NAMES)
def test_the_tui_summarises_every_old_event_as_before(name):
    expected = golden(name)
    events = list(read_events(JOURNALS / "sessions" / expected["id"] / "events.jsonl"))
    assert [[e.seq, e.type, event_summary(e.type, e.data)] for e in events] == expected["summaries"]


@pytest.mark.parametrize("name", NAMES)
def test_prompt_at_renders_the_context_the_model_saw(name, sessions, capsys):
    expected = golden(name)
    sent = [{k: v for k, v in r.items() if k != "stream"} for r in expected.get("requests", [])]
    for seq, text in expected["prompt_text"].items():
        assert show(capsys, expected["id"], "--prompt-at", seq, "--sessions-dir", str(sessions)) == text, seq
        body = json.loads(show(capsys, expected["id"], "--prompt-at", seq, "--json", "--sessions-dir", str(sessions)))
        want = expected["prompt_json"][seq]
        assert body == (sent[want["request"]] if set(want) == {"request"} else want), seq


@pytest.mark.parametrize("name", NAMES)
def test_the_checkpoint_and_a_full_fold_agree(name, sessions):
    expected = golden(name)
    files = SessionStore(sessions).open(expected["id"], writer=False)
    from_checkpoint = load_state(files)
    full = fold(e.to_dict() for e in read_events(files.events_path))
    assert from_checkpoint.to_dict() == full.to_dict()
    # Their version-1 checkpoints predate the pool's fields of an attempt: the state is folded from the journal.
    assert files.meta["schema_version"] == 2 and "state" not in files.meta
    assert full.best is None or full.best_attempt.confirmed is None, "a best from before the pool stood as judged"
    history = load_history(files.dir)
    assert sorted(history.steps) == sorted(full.attempts) and history.state.best == full.best


@pytest.mark.parametrize("name", ("tuner", "claude"))
def test_headless_lines_replay_from_the_journal(name):
    expected = golden(name)
    out = io.StringIO()
    state = SessionState()
    sink = HeadlessSink(state, out)
    for event in read_events(JOURNALS / "sessions" / expected["id"] / "events.jsonl"):
        apply(state, event.to_dict())
        sink.emit(event)
    printed = [line for line in expected["headless"].splitlines()
               if line.startswith(("attempt ", "nudge ", "stopped: ", "error: "))]
    assert out.getvalue().splitlines() == printed


def fake_evaluator(task, path, device, heldout=False):
    return {"verdict": "ok", "message": "", "speedup": 2.0, "timing_comparable": False,
            "shapes": [{"name": "C1", "correct": True, "ms": 0.5, "speedup": 2.0}]}


def resume(sessions: Path, name: str, backend_of, budget_of) -> tuple:
    from workbench.agent.evaluation import FunctionEvaluator
    from workbench.agent.runtime import AgentRuntime
    from workbench.tasks import load_task

    expected = golden(name)
    files = SessionStore(sessions).open(expected["id"], writer=True)
    before = files.events_path.read_bytes()
    state = load_state(files)
    task = load_task(state.task, root=TASKS if state.task == "tiny" else None)
    runtime = AgentRuntime(files, state, task, backend_of(task, state), device=state.device, budget=budget_of(state),
                           evaluator=FunctionEvaluator(fake_evaluator, state.device))
    return runtime, files, before


def tuner_backend(task, state):
    from workbench.agent.backends.tuner import TunerBackend

    return TunerBackend(state.start_source or task.seed.read_text())


def check_resumed(files, before: bytes) -> list:
    after = files.events_path.read_bytes()
    assert after.startswith(before), "nothing journaled before the resume changed"
    events = list(read_events(files.events_path))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    written = [e.data["attempt"] for e in events if e.type == "attempt.written"]
    assert written == sorted(set(written)), "no attempt number is reused"
    assert {e.data["call_id"] for e in events if e.type == "tool.call"} == \
        {e.data["call_id"] for e in events if e.type == "tool.result"}, "every intent is closed"
    return events


def test_an_old_tuner_session_resumes_with_one_more_attempt(sessions):
    runtime, files, before = resume(sessions, "tuner", tuner_backend,
                                    lambda s: Budget.from_dict({**s.budget, "max_iterations": s.evaluated + 1}))
    evaluated = runtime.state.evaluated
    assert runtime.run(threading.Event(), queue.Queue()).startswith("budget: max iterations")
    events = check_resumed(files, before)
    started = [e for e in events if e.type == "run.started"]
    assert started[-1].data["resumed"] is True and runtime.state.evaluated == evaluated + 1
    assert max(runtime.state.attempts) == 6
    files.close()


def test_a_run_killed_mid_evaluation_resumes_by_closing_the_call_and_evaluating_the_attempt(sessions):
    runtime, files, before = resume(sessions, "killed", tuner_backend, lambda s: Budget(max_iterations=2))
    assert set(runtime.state.in_flight) == {"c000002"} and runtime.state.attempts[2].verdict is None
    runtime.run(threading.Event(), queue.Queue())
    events = check_resumed(files, before)
    aborted = [e for e in events if e.type == "tool.result" and e.data.get("aborted")]
    assert [e.data["call_id"] for e in aborted] == ["c000002"]
    assert runtime.state.attempts[2].verdict == "ok" and sorted(runtime.state.attempts) == [1, 2]
    files.close()


def test_an_old_claude_session_resumes_with_the_same_context(sessions):
    anthropic = pytest.importorskip("anthropic")
    from fake_anthropic import KEY, FakeAnthropic, Message, plain, tool_use

    from workbench.agent.backends.claude import claude_backend

    expected = golden("claude")
    with FakeAnthropic([Message([tool_use("r1", "finish", {"reason": "still done"})])]) as server:
        def backend(task, state):
            client = anthropic.Anthropic(api_key=KEY, base_url=server.base_url, max_retries=0)
            return claude_backend(state.model, seed_source=task.seed.read_text(), client=client)

        # A budget large enough that the resume does not compact first: the old context must come back as it was.
        runtime, files, before = resume(sessions, "claude", backend,
                                        lambda s: Budget.from_dict({**s.budget, "context_tokens": 100_000}))
        assert runtime.run(threading.Event(), queue.Queue()) == "the model finished: still done"
        (request,) = server.requests
    check_resumed(files, before)
    last = expected["requests"][-1]
    assert plain(request["system"]) == plain(last["system"])
    # The tools are today's (prompts version 2: evaluate takes several attempts and a wait); the ones the old
    # session was shown are version 1's exactly, so show --prompt-at rebuilds them.
    from workbench.agent.tools import specs

    def shown(version):
        return [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in specs(version)]

    assert request["tools"] == shown(None) != shown(1) == last["tools"]
    # The conversation goes on from where it stopped: the old context, the model's finish call, its result.
    assert plain(request["messages"][:-2]) == plain(last["messages"])
    assert [b["name"] for b in request["messages"][-2]["content"] if b["type"] == "tool_use"] == ["finish"]
    results = [b for b in request["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert len(results) == 1 and "the person resumed the run" in results[0]["content"][0]["text"]
    files.close()
