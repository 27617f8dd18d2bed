"""SessionState as a pure fold: best tracking, in-flight calls, nudges, elapsed time, checkpoint round trip."""

from workbench.session.state import SessionState, apply, fold


def ev(seq, type, data=None, ts=None):
    return {"seq": seq, "ts": ts or f"2026-11-29T10:00:{seq:02d}.000Z", "type": type, "data": data or {}, "prev": ""}


def attempt(seq, n, parent=None, params=None):
    return ev(seq, "attempt.written", {"attempt": n, "parent": parent, "sha256": "x", "author": "agent",
                                       "note": "", "params": params or {}, "source": f"# {n}"})


def result(seq, n, verdict="ok", speedup=1.0):
    return ev(seq, "eval.finished", {"attempt": n, "result": {"verdict": verdict, "message": "m", "speedup": speedup,
                                                              "timing_comparable": True,
                                                              "shapes": [{"name": "S", "ms": 0.5}]}})


def test_best_follows_the_fastest_ok_attempt_only():
    state = fold([
        ev(1, "session.created", {"id": "s", "task": "softmax", "agent": "tuner", "device": "cpu", "budget": {}}),
        attempt(2, 1), result(3, 1, speedup=1.0),
        attempt(4, 2, 1), result(5, 2, speedup=2.0),
        attempt(6, 3, 2), result(7, 3, verdict="incorrect", speedup=50.0),
        attempt(8, 4, 2), result(9, 4, verdict="implausible", speedup=400.0),
    ])
    assert state.best == 2
    assert state.best_attempt.speedup == 2.0
    assert state.next_attempt == 5
    assert state.evaluated == 4
    assert state.attempts[1].ms == 0.5


def test_re_evaluation_that_fails_demotes_the_best():
    state = fold([attempt(1, 1), result(2, 1, speedup=1.0), attempt(3, 2), result(4, 2, speedup=3.0),
                  result(5, 2, verdict="incorrect", speedup=None)])
    assert state.best == 1


def test_tool_call_without_result_is_in_flight():
    state = fold([ev(1, "tool.call", {"call_id": "c1", "tool": "evaluate", "args": {}}),
                  ev(2, "tool.result", {"call_id": "c1", "tool": "evaluate", "ok": True}),
                  ev(3, "tool.call", {"call_id": "c2", "tool": "evaluate", "args": {"attempt": 2}})])
    assert state.tool_calls == 2
    assert list(state.in_flight) == ["c2"]


def test_nudges_one_shot_become_inactive_persistent_stay_until_revoked():
    state = fold([ev(1, "nudge.received", {"id": "a", "text": "x", "persistent": False}),
                  ev(2, "nudge.received", {"id": "b", "text": "y", "persistent": True}),
                  ev(3, "nudge.acked", {"id": "a"}), ev(4, "nudge.acked", {"id": "b"})])
    assert [n["id"] for n in state.active_nudges()] == ["b"]
    apply(state, ev(5, "nudge.acked", {"id": "b", "revoked": True}))
    assert state.active_nudges() == []


def test_elapsed_counts_running_intervals_only():
    state = fold([
        ev(1, "run.started", ts="2026-11-29T10:00:00.000Z"),
        ev(2, "run.paused", ts="2026-11-29T10:00:10.000Z"),
        ev(3, "run.resumed", ts="2026-11-29T10:05:00.000Z"),
        ev(4, "run.stopped", {"reason": "budget"}, ts="2026-11-29T10:05:05.000Z"),
    ])
    assert state.elapsed_at() == 15.0
    assert state.status == "stopped" and state.stop_reason == "budget"


def test_finished_run_is_final():
    state = fold([ev(1, "run.started"), ev(2, "run.stopped", {"reason": "exhausted", "final": True})])
    assert state.status == "finished"


def test_checkpoint_round_trip_then_tail_equals_full_fold():
    events = [attempt(1, 1, params={"B": 1}), result(2, 1, speedup=1.0), attempt(3, 2, 1), result(4, 2, speedup=1.5),
              ev(5, "nudge.received", {"id": "n", "text": "t", "persistent": True})]
    full = fold(events)
    head = SessionState.from_dict(fold(events[:3]).to_dict())
    resumed = fold(events[3:], head)
    assert resumed.to_dict() == full.to_dict()
    assert resumed.attempts[1].params == {"B": 1}


def test_fold_does_not_mutate_its_input_state():
    base = fold([attempt(1, 1)])
    fold([attempt(2, 2)], base)
    assert list(base.attempts) == [1]


def test_a_run_started_from_a_kernel_file_keeps_it_through_a_checkpoint():
    events = [ev(1, "session.created", {"id": "x", "task": "kda", "agent": "tuner", "budget": {},
                                        "start": {"file": "/k/kda_chunked.py", "sha256": "ab", "source": "src"}})]
    state = fold(events)
    assert (state.start_file, state.start_source) == ("/k/kda_chunked.py", "src")
    assert SessionState.from_dict(state.to_dict()).start_source == "src"
    assert fold([ev(1, "session.created", {"id": "y", "task": "kda", "budget": {}})]).start_source == ""


def test_every_event_type_has_one_typed_definition_and_one_fold_handler():
    from workbench.journal.events import EVENT_DATA, EVENT_TYPES
    from workbench.session.state import HANDLERS

    assert set(HANDLERS) == set(EVENT_DATA) == EVENT_TYPES
