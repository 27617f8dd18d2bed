"""Event lines and number formats the live screen shows, and the bridge that carries events to it."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import pytest
from textual.message import Message

from tests.snapshot_apps.fake_runtime import FakeRuntime, load_events
from tests.snapshot_apps.live_app import make_live_app, wait_for
from tests.snapshot_apps.live_app import pinned_utc  # noqa: F401 - autouse: log times in UTC
from workbench.journal import EVENT_TYPES, Event
from workbench.ui import formatting as fmt
from workbench.ui.bridge import UiBridge
from workbench.ui.messages import JournalEvent, Notice, Question
from workbench.ui.screens.question import QuestionScreen



def test_every_fixture_event_is_one_aligned_line() -> None:
    for event in load_events():
        line = fmt.event_line(event.to_dict())
        assert "\n" not in line and len(line) <= fmt.LINE_LIMIT
        assert line[:8] == event.ts[11:19]  # local time, pinned to UTC here
        assert line[9:14].strip() == str(event.seq) and line[15:15 + fmt.TYPE_WIDTH].rstrip() == event.type


@pytest.mark.parametrize(
    ("kind", "data", "expected"),
    [
        ("eval.finished", {"attempt": 3, "result": {"verdict": "incorrect", "message": "S1: rel_rms 0.9 > 1e-05",
                                                    "shapes": []}}, "attempt 3: incorrect — S1: rel_rms 0.9 > 1e-05"),
        ("attempt.written", {"attempt": 1, "parent": None, "author": "start", "note": "--start mine.py",
                             "params": {"BLOCK": 64}}, "attempt 1 the starting kernel: --start mine.py [BLOCK=64]"),
        ("attempt.written", {"attempt": 3, "parent": 2, "author": "human", "note": "edited by hand (kernel.py)"},
         "attempt 3 ← 2 by human: edited by hand (kernel.py)"),
        ("eval.finished", {"attempt": 4, "result": {"verdict": "ok", "speedup": 1.5, "timing_comparable": False,
                                                    "shapes": [{"ms": 0.25}, {"ms": 0.5}]}},
         "attempt 4: ok 1.50× 0.75 ms (timing not comparable)"),
        ("tool.result", {"call_id": "c1", "tool": "evaluate", "ok": False, "error": "evaluate: no attempt 9"},
         "c1 evaluate FAILED: evaluate: no attempt 9"),
        ("tool.result", {"call_id": "c2", "tool": "evaluate", "ok": False, "aborted": True, "error": "interrupted"},
         "c2 evaluate ABORTED: interrupted"),
        ("tool.call", {"call_id": "c3", "tool": "evaluate", "args": {"source_sha256": "ab", "source_chars": 900,
                                                                    "note": "x"}},
         "c3 evaluate note=x source=<900 chars>"),
        ("run.stopped", {"reason": "budget: max iterations (20) reached", "final": False},
         "stopped: budget: max iterations (20) reached"),
        ("run.stopped", {"reason": "nothing left to try", "final": True}, "finished: nothing left to try"),
        ("nudge.received", {"id": "n1", "text": "try fp16", "persistent": True}, "n1 (persistent): try fp16"),
        ("nudge.acked", {"id": "n1", "revoked": True}, "n1 acknowledged revoked"),
        ("llm.response", {"input_tokens": 1200, "output_tokens": 300, "cost_usd": 0.0123},
         "1200 in / 300 out tokens · $0.0123"),
        ("memory.compacted", {"summary": "online softmax won; wider tiles hurt S3", "upto": 800},
         "online softmax won; wider tiles hurt S3"),
        ("error", {"message": "OSError: disk full"}, "OSError: disk full"),
        ("checkpoint.written", {"seq": 25}, "checkpoint at seq 25"),
        ("eval.queued", {"job": "j00007", "attempt": 5, "kind": "heldout", "slot": "cuda:1", "requeue_of": "j00004"},
         "j00007 held-out check of attempt 5 queued on cuda:1 (again: j00004 was interrupted)"),
        ("eval.started", {"job": "j00007", "attempt": 5, "slot": {"slot": "ray:host-b:cuda:3"}},
         "j00007 attempt 5 on ray:host-b:cuda:3"),
        ("eval.requeued", {"job": "j00007", "attempt": 5, "slot": {"slot": "cuda:0"}, "message": "CUDA context fault"},
         "j00007 attempt 5 left cuda:0 for another slot: CUDA context fault"),
        ("eval.failed", {"job": "j00008", "attempt": 6, "cancelled": True, "message": "the run stopped"},
         "j00008 attempt 6 cancelled: the run stopped"),
        ("fleet.slot", {"slot": {"slot": "cuda:2"}, "state": "retired", "message": "faulted twice",
                        "reference": "cuda:0"}, "cuda:2 retired: faulted twice · reference now cuda:0"),
    ],
)
def test_event_summaries(kind: str, data: dict[str, Any], expected: str) -> None:
    assert fmt.event_summary(kind, data) == expected


def test_every_event_type_has_its_own_summary_that_survives_empty_data() -> None:
    # One summary per type, read from its typed data; an old journal's event may lack any key.
    assert set(fmt.SUMMARIES) == EVENT_TYPES
    for kind in EVENT_TYPES:
        fmt.event_summary(kind, {})


def test_numbers() -> None:
    assert [fmt.ms(v) for v in (None, 0.0283, 0.1184, 12.345, 123.4, 1234.5, 0.00012)] == [
        "–", "0.0283", "0.118", "12.3", "123", "1,234", "1.20e-04"]
    assert fmt.speedup(1.634) == "1.63×" and fmt.speedup(None) == "–"
    assert fmt.rel_err(1.2e-4) == "1.2e-04"
    assert fmt.duration(0) == "0:00:00" and fmt.duration(3725.9) == "1:02:05" and fmt.duration(-3) == "0:00:00"


def test_goal_fields() -> None:
    assert fmt.tolerance({"metric": "rel_rms", "value": 1e-5}) == "rel_rms ≤ 1e-05"
    assert fmt.tolerance({"metric": "rel_rms", "value": 2e-2, "per_output": {"S": 1e-3}}) == \
        "rel_rms ≤ 0.02 (S ≤ 0.001)"
    assert fmt.tolerance(None) == "–"
    assert fmt.baseline({"name": "fla.chunk_kda", "available": True}) == "fla.chunk_kda"
    assert fmt.budget({}) == "unlimited"
    assert fmt.budget({"max_iterations": 5, "max_cost": 2.5}) == "5 attempts · $2.5"
    assert fmt.shape({"name": "S1", "params": {"rows": 4096, "cols": 4096}}) == "S1 4096×4096"
    assert fmt.shape({"name": "K1", "params": {"T": 64, "dtype": "bfloat16"}}) == "K1 T=64 dtype=bfloat16"


def test_ledger_entries_of_any_shape_are_shown_not_dropped() -> None:
    assert fmt.ledger_entry({"strategy": "online softmax", "status": "worked", "attempts": [3, 4],
                             "speedup": 1.49}) == ("worked", "online softmax #3,4 1.49×")
    assert fmt.ledger_entry("plain text entry") == ("", "plain text entry")
    status, text = fmt.ledger_entry({"outcome": "failed", "custom": "layout"})
    assert status == "failed" and "custom=layout" in text


def test_hang_indents_continuation_lines() -> None:
    text = fmt.hang("alpha beta gamma delta epsilon", width=20, indent=10)
    lines = text.split("\n")
    assert len(lines) > 1 and all(line.startswith(" " * 10) for line in lines[1:])


def test_bridge_posts_messages() -> None:
    posted: list[Message] = []
    bridge = UiBridge(lambda message: posted.append(message) or True)
    event = Event(1, "2026-11-29T22:13:00.000Z", "run.paused", {}, "")
    bridge.emit(event)
    bridge.notify("compacting memory", "warning")
    future = bridge.ask("continue?")
    assert isinstance(posted[0], JournalEvent) and posted[0].event is event
    assert isinstance(posted[1], Notice) and (posted[1].text, posted[1].severity) == ("compacting memory", "warning")
    assert isinstance(posted[2], Question) and posted[2].future is future and not future.done()
    assert isinstance(future, Future)


async def test_the_bridge_never_waits_for_a_busy_ui() -> None:
    # The agent thread reports through the bridge while the UI's event loop is stuck (here: blocked on purpose
    # until the agent thread is done). A bridge that waited for the UI (call_from_thread) would never return.
    app, _ = make_live_app(FakeRuntime([]))
    async with app.run_test(size=(120, 40)):
        bridge = UiBridge(app.post_message)
        done = threading.Event()

        def agent() -> None:
            for seq in range(1, 4):
                bridge.emit(Event(seq, load_events()[-1].ts, "checkpoint.written", {"seq": seq}, ""))
            bridge.notify("busy UI", "information")
            bridge.ask("still there?")
            done.set()

        thread = threading.Thread(target=agent, daemon=True)
        thread.start()
        assert done.wait(5.0), "the bridge blocked on a UI that was not running its event loop"
        await wait_for(lambda: app.state.last_seq == 3 and isinstance(app.screen, QuestionScreen))


async def test_a_burst_of_journal_events_reaches_the_state_one_by_one() -> None:
    # Queued messages may collapse into newer ones (Message.can_replace); journal events never may.
    app, _ = make_live_app(FakeRuntime([]))
    async with app.run_test(size=(120, 40)):
        start = app.state.last_seq
        for i in range(1, 201):
            app.post_message(JournalEvent(Event(start + i, load_events()[-1].ts, "tool.call",
                                                {"call_id": f"x{i}", "tool": "read_task"}, "")))
        await wait_for(lambda: app.state.last_seq == start + 200)
        assert len(app.state.in_flight) == 200
        assert [e["seq"] for e in app.recent][-200:] == list(range(start + 1, start + 201))
