"""The shared step loop with the tuner backend: journal-first effects, budgets, nudges, pause, crash recovery."""

import json
import queue
import threading
import time
from types import SimpleNamespace

import pytest

from workbench.agent.backends.transport import BackendError
from workbench.agent.backends.tuner import TunerBackend, parse_pins
from workbench.agent.budget import Budget
from workbench.agent.commands import Command
from workbench.agent.evaluation import FunctionEvaluator
from workbench.agent.runtime import AgentRuntime
from workbench.agent.sink import RecordingSink
from workbench.agent.tools import ToolError, confined_path
from workbench.agent.tunables import read_declared
from workbench.fleet.api import SlotInfo
from workbench.fleet.local import LocalPool
from workbench.journal import read_events
from workbench.session import SessionStore
from workbench.session.replay import load_state
from workbench.session.state import SessionState

SEED = '''"""toy kernel"""
TUNABLES = {"BLOCK": [1, 2, 4, 8], "num_warps": [1, 2, 4]}
CONFIG = {"BLOCK": 1, "num_warps": 1}


def forward(x):
    return x
'''
TASK = SimpleNamespace(name="toy", public_view=lambda: {"name": "toy"})


def fake_evaluator(calls=None, fail_blocks=()):
    """Speedup grows with BLOCK*num_warps; some BLOCK values are 'incorrect'."""

    def evaluate(task, path, device, heldout=False):
        config = read_declared(path.read_text()).config
        if calls is not None and not heldout:  # held-out re-checks of a new best are not new evaluations
            calls.append(config)
        if config["BLOCK"] in fail_blocks:
            return {"verdict": "incorrect", "message": "S1 rel_err 1 > 1e-5", "speedup": None, "shapes": [],
                    "timing_comparable": False}
        speed = config["BLOCK"] * config["num_warps"] / 4
        return {"verdict": "ok", "message": "", "speedup": speed, "timing_comparable": True,
                "shapes": [{"name": "S1", "ms": 1 / speed, "speedup": speed}]}

    return evaluate


def new_runtime(tmp_path, budget, evaluator=None, kernel_observer=None):
    files = SessionStore(tmp_path).create(task="toy", agent="tuner", model=None, device="cpu",
                                          budget=budget.to_dict())
    runtime = AgentRuntime(files, SessionState(), TASK, TunerBackend(SEED), device="cpu", budget=budget,
                           evaluator=FunctionEvaluator(evaluator or fake_evaluator()), checkpoint_every=5,
                           kernel_observer=kernel_observer)
    runtime.emit("session.created", {"id": files.id, "task": "toy", "agent": "tuner", "device": "cpu",
                                     "budget": budget.to_dict()})
    return runtime, files


def test_tuner_runs_until_the_space_is_exhausted_and_keeps_the_best(tmp_path):
    runtime, files = new_runtime(tmp_path, Budget())
    sink = RecordingSink()
    reason = runtime.run(threading.Event(), queue.Queue(), sink)
    state = runtime.state
    assert reason == "search space exhausted" and state.status == "finished"
    assert len(state.attempts) == 12  # the whole 4 x 3 grid, each config once
    assert state.best_attempt.params == {"BLOCK": 8, "num_warps": 4}
    # one attempt per tool-call pair, every intent closed by a result
    types = [e.type for e in sink.events]
    assert types.count("tool.call") == types.count("tool.result") == 12
    assert not state.in_flight
    # attempts/NNNN are materialised with kernel, result and a diff against the parent
    d = files.attempt_dir(3)
    assert (d / "kernel.py").read_text() == state.attempts[3].source
    assert (d / "result.json").exists() and (d / "diff.patch").exists()
    files.close()


def test_budget_stops_and_resume_continues_without_reusing_numbers(tmp_path):
    runtime, files = new_runtime(tmp_path, Budget(max_iterations=3))
    assert runtime.run(threading.Event()).startswith("budget: max iterations (3)")
    assert runtime.state.status == "stopped"
    files.close()

    files = SessionStore(tmp_path).open(files.id, writer=True)
    state = load_state(files)
    assert state.evaluated == 3 and state.status == "stopped"
    resumed = AgentRuntime(files, state, TASK, TunerBackend(SEED), device="cpu", budget=Budget(max_iterations=5),
                           evaluator=FunctionEvaluator(fake_evaluator()))
    resumed.run(threading.Event())
    assert sorted(resumed.state.attempts) == [1, 2, 3, 4, 5]
    seqs = [e.seq for e in read_events(files.dir / "events.jsonl")]
    assert seqs == list(range(1, len(seqs) + 1))
    files.close()


def test_interrupted_tool_call_is_aborted_and_the_attempt_re_evaluated_once(tmp_path):
    calls = []
    runtime, files = new_runtime(tmp_path, Budget(max_iterations=1), fake_evaluator(calls))
    runtime.run(threading.Event())
    # simulate a crash in the middle of the next evaluate: intent and attempt journaled, no result
    runtime.emit("tool.call", {"call_id": "c999999", "tool": "evaluate", "args": {}})
    runtime.write_attempt(SEED.replace('"BLOCK": 1,', '"BLOCK": 2,'), note="x", params={"BLOCK": 2, "num_warps": 1},
                          parent=1)
    files.close()

    files = SessionStore(tmp_path).open(files.id, writer=True)
    state = load_state(files)
    assert "c999999" in state.in_flight and state.attempts[2].verdict is None
    rt = AgentRuntime(files, state, TASK, TunerBackend(SEED), device="cpu", budget=Budget(max_iterations=2),
                      evaluator=FunctionEvaluator(fake_evaluator(calls)))
    rt.run(threading.Event())
    aborted = [e for e in read_events(files.dir / "events.jsonl") if e.type == "tool.result" and e.data.get("aborted")]
    assert [e.data["call_id"] for e in aborted] == ["c999999"]
    assert rt.state.attempts[2].verdict == "ok" and sorted(rt.state.attempts) == [1, 2]
    assert calls == [{"BLOCK": 1, "num_warps": 1}, {"BLOCK": 2, "num_warps": 1}]
    files.close()


def test_nudge_pins_a_tunable_and_is_journaled_received_then_acked(tmp_path):
    calls = []
    runtime, files = new_runtime(tmp_path, Budget(max_iterations=4), fake_evaluator(calls))
    commands = queue.Queue()
    commands.put(Command("nudge", "please try num_warps=4", persistent=True))
    runtime.run(threading.Event(), commands)
    received = [e for e in read_events(files.dir / "events.jsonl") if e.type.startswith("nudge.")]
    assert [e.type for e in received] == ["nudge.received", "nudge.acked"]
    assert "pinning num_warps=4" in received[1].data["note"]
    # the seed runs first (it was chosen before the nudge), every later attempt honours the pin
    assert all(c["num_warps"] == 4 for c in calls[1:]) and len(calls) == 4
    files.close()


def test_inbox_nudge_and_pause_resume_at_step_boundaries(tmp_path):
    runtime, files = new_runtime(tmp_path, Budget(max_iterations=2))
    files.drop_nudge("free text the tuner cannot use", persistent=False)
    commands = queue.Queue()
    commands.put(Command("pause"))
    stop = threading.Event()
    worker = threading.Thread(target=runtime.run, args=(stop, commands))
    started = time.monotonic()
    worker.start()
    worker.join(0.6)
    assert worker.is_alive() and runtime.state.status == "paused" and runtime.state.evaluated == 0
    commands.put(Command("resume"))
    worker.join(10)
    wall = time.monotonic() - started
    assert not worker.is_alive()
    acked = [n for n in runtime.state.nudges if n["acked"]]
    assert len(acked) == 1 and not runtime.state.active_nudges()
    # running time leaves the paused 0.6 s out (what --max-hours counts)
    assert 0 < runtime.state.elapsed_at() <= wall - 0.5
    files.close()


def test_stop_event_ends_the_run_resumably(tmp_path):
    runtime, files = new_runtime(tmp_path, Budget())
    stop = threading.Event()
    stop.set()
    assert runtime.run(stop) == "stopped by the person"
    assert runtime.state.status == "stopped"
    files.close()


class Stuck:
    """A slot runner whose evaluation runs until the pool aborts it (or closes it)."""

    def __init__(self) -> None:
        self.started, self.aborted = threading.Event(), threading.Event()

    def run(self, job):
        self.started.set()
        assert self.aborted.wait(30), "never aborted"
        raise RuntimeError("killed")

    def abort(self) -> None:
        self.aborted.set()

    def close(self) -> None:
        self.aborted.set()


def test_a_stop_request_aborts_the_evaluation_in_flight_and_journals_the_reason_and_the_job(tmp_path):
    stuck = Stuck()
    pool = LocalPool([(SlotInfo("cpu:0", "cpu"), stuck)])
    files = SessionStore(tmp_path).create(task="toy", agent="tuner", model=None, device="cpu", budget={})
    runtime = AgentRuntime(files, SessionState(), TASK, TunerBackend(SEED), device="cpu", budget=Budget(), pool=pool)
    threading.Thread(target=lambda: stuck.started.wait(30) and runtime.request_stop("stopped by signal SIGTERM"),
                     daemon=True).start()
    started = time.monotonic()
    assert runtime.run(threading.Event()) == "stopped by signal SIGTERM"
    assert time.monotonic() - started < 10 and stuck.aborted.is_set()
    events = list(read_events(files.dir / "events.jsonl"))
    assert not [e for e in events if e.type == "eval.finished"] and runtime.state.attempts[1].verdict is None
    (job,) = [e.data["job"] for e in events if e.type == "eval.queued"]
    assert [e.type for e in events[-2:]] == ["run.stopped", "checkpoint.written"]
    assert events[-2].data == {"reason": "stopped by signal SIGTERM", "final": False, "interrupted": [job]}
    files.close()


def test_failing_seed_finishes_with_its_verdict(tmp_path):
    runtime, files = new_runtime(tmp_path, Budget(), fake_evaluator(fail_blocks=(1,)))
    reason = runtime.run(threading.Event())
    assert reason.startswith("no correct kernel to tune: attempt 1 is incorrect")
    files.close()


def test_an_evaluator_exception_is_a_journaled_failure_and_stops_the_run_resumably(tmp_path):
    def broken(task, path, device, **kw):
        raise RuntimeError("boom")

    runtime, files = new_runtime(tmp_path, Budget(), broken)
    with pytest.raises(BackendError, match="attempt 1 could not be evaluated: RuntimeError: boom"):
        runtime.run(threading.Event())
    assert runtime.state.status == "stopped" and "boom" in runtime.state.stop_reason
    failed = [e for e in read_events(files.dir / "events.jsonl") if e.type == "eval.failed"]
    assert [(e.data["attempt"], e.data["message"]) for e in failed] == [(1, "RuntimeError: boom")]
    files.close()


def test_parse_pins_only_takes_declared_names():
    assert parse_pins("try num_warps=8, BLOCK=4 and foo=1", {"num_warps", "BLOCK"}) == {"num_warps": 8, "BLOCK": 4}


def test_profile_command_on_cpu_is_a_journaled_tool_error_and_a_notice(tmp_path):
    runtime, files = new_runtime(tmp_path, Budget(max_iterations=1))
    commands = queue.Queue()
    sink = RecordingSink()
    runtime.run(threading.Event(), commands, sink)
    commands.put(Command("profile"))
    runtime.run(threading.Event(), commands, sink)  # budget already reached: only the command runs
    results = [e for e in sink.events if e.type == "tool.result" and e.data["tool"] == "profile"]
    assert len(results) == 1 and not results[0].data["ok"]
    assert "needs a CUDA device" in results[0].data["error"]
    assert any("needs a CUDA device" in n for n in sink.notices)
    files.close()


def test_cuda_evaluation_profiles_are_journaled_with_deltas_against_the_best(tmp_path):
    base = fake_evaluator()

    def with_profile(task, path, device, **kw):
        result = base(task, path, device)
        occupancy = read_declared(path.read_text()).config["num_warps"] * 10.0
        result["profile"] = {"shapes": [{"name": "S1", "ms": result["shapes"][0]["ms"],
                                         "roofline": {"class": "memory-bound", "achieved_tbps": occupancy / 10}}],
                             "findings": []}
        return result

    runtime, files = new_runtime(tmp_path, Budget(max_iterations=2), with_profile)
    runtime.run(threading.Event())
    profiles = [e for e in read_events(files.dir / "events.jsonl") if e.type == "profile.finished"]
    assert [p.data["attempt"] for p in profiles] == [1, 2]
    assert "deltas" not in profiles[0].data
    assert profiles[1].data["against"] == 1 and isinstance(profiles[1].data["deltas"], list)
    assert runtime.state.profile["attempt"] == 2
    files.close()


def test_a_hand_edit_of_the_working_copy_becomes_a_human_attempt_and_is_evaluated(tmp_path):
    runtime, files = new_runtime(tmp_path, Budget(max_iterations=1))
    runtime.run(threading.Event())
    working = files.dir / "kernel.py"
    assert working.read_text() == runtime.state.attempts[1].source
    edited = runtime.state.attempts[1].source.replace('"num_warps": 1}', '"num_warps": 4}') + "# by hand\n"
    working.write_text(edited)
    runtime.budget = Budget(max_iterations=2)
    sink = RecordingSink()
    runtime.run(threading.Event(), queue.Queue(), sink)
    human = runtime.state.attempts[2]
    assert human.author == "human" and human.source == edited and human.parent == 1
    assert human.verdict == "ok" and runtime.state.best == 2
    assert any("attempt 2" in n for n in sink.notices)
    # the file now equals the current attempt: not an edit again
    runtime.budget = Budget(max_iterations=3)
    runtime.run(threading.Event())
    assert runtime.state.attempts[3].author == "agent"
    files.close()


def test_tuner_finishes_cleanly_when_the_best_kernel_declares_no_tunables(tmp_path):
    base = fake_evaluator()

    def evaluate(task, path, device, **kw):
        if "CONFIG" not in path.read_text():  # the hand-written kernel without tunables is the fastest
            return {"verdict": "ok", "message": "", "speedup": 9.0, "timing_comparable": True, "shapes": []}
        return base(task, path, device)

    runtime, files = new_runtime(tmp_path, Budget(max_iterations=1), evaluate)
    runtime.run(threading.Event())
    (files.dir / "kernel.py").write_text("def forward(x):\n    return x  # by hand, no tunables\n")
    runtime.budget = Budget()
    reason = runtime.run(threading.Event())
    assert runtime.state.attempts[2].author == "human" and runtime.state.attempts[2].params == {}
    assert runtime.state.best == 2
    assert reason.startswith("the best attempt (2) declares no usable TUNABLES/CONFIG")
    assert runtime.state.status == "finished"
    files.close()


def test_a_new_best_must_pass_the_held_out_shapes_which_stay_hidden_from_the_agent(tmp_path):
    calls = []
    base = fake_evaluator()

    def evaluate(task, path, device, heldout=False):
        result = base(task, path, device)
        config = read_declared(path.read_text()).config
        calls.append((config["BLOCK"], config["num_warps"], heldout))
        if heldout:
            bad = config["BLOCK"] == 2  # overfits the public shapes
            result["heldout"] = [{"name": "H1", "params": {"rows": 1000}, "correct": not bad, "speedup": 1.0}]
            result["heldout_speedup"] = 1.0
            if bad:
                result["verdict"], result["message"] = "incorrect", "H1 rows=1000: rel_err 0.3 > 1e-5"
        return result

    runtime, files = new_runtime(tmp_path, Budget(max_iterations=3), evaluate)
    runtime.run(threading.Event())
    state = runtime.state
    # attempt 1 (seed) and 2 (BLOCK=2) were each a new best and got a held-out check; 2 failed it
    assert [c for c in calls if c[2]] == [(1, 1, True), (2, 1, True)] + [c for c in calls if c[2]][2:]
    assert state.attempts[2].verdict == "incorrect" and "held-out" in state.attempts[2].message
    assert "rows=1000" not in (files.dir / "events.jsonl").read_text()  # no held-out detail in the journal
    assert state.best != 2
    assert json.loads((files.dir / "heldout" / "0002.json").read_text())["heldout"][0]["params"] == {"rows": 1000}
    with pytest.raises(ToolError, match="hidden"):
        confined_path("heldout/0002.json", [(files.dir, None)])
    files.close()


def heldout_passing_evaluator():
    base = fake_evaluator()

    def evaluate(task, path, device, heldout=False):
        result = base(task, path, device)
        if heldout:
            result["heldout"] = [{"name": "H1", "correct": True, "speedup": 1.0}]
        return result

    return evaluate


def test_a_new_best_whose_kernels_ncu_sees_as_foreign_is_refused(tmp_path):
    """The outside observer (ncu on CUDA) lists the kernels; one that is not the candidate's demotes the best."""
    seen = []

    def observer(task, path, gpu):
        config = read_declared(path.read_text()).config
        seen.append(config["BLOCK"])
        foreign = config["BLOCK"] == 2
        return {"observer": "ncu", "shape": "S1", "kernels": ["_k"] + (["ampere_sgemm_128x64_nn"] if foreign else []),
                "problems": ["forward launched GPU kernels that are not the candidate's Triton kernels (_k): "
                             "ampere_sgemm_128x64_nn (x1)"] if foreign else []}

    runtime, files = new_runtime(tmp_path, Budget(max_iterations=3), heldout_passing_evaluator(), observer)
    runtime.run(threading.Event())
    state = runtime.state
    assert seen[:2] == [1, 2]  # every new best, after its held-out shapes passed
    assert state.attempts[2].verdict == "forbidden" and "seen by ncu" in state.attempts[2].message
    assert state.best != 2
    checks = [e for e in read_events(files.dir / "events.jsonl")
              if e.type == "eval.finished" and e.data.get("check") == "heldout"]
    assert checks[0].data["observed"]["kernels"] == ["_k"] and checks[1].data["observed"]["problems"]
    files.close()


def test_an_observer_that_cannot_run_is_noted_and_the_best_stands(tmp_path):
    def observer(task, path, gpu):
        raise RuntimeError("ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM)")

    runtime, files = new_runtime(tmp_path, Budget(max_iterations=2), heldout_passing_evaluator(), observer)
    runtime.run(threading.Event())
    assert runtime.state.best is not None
    checks = [e for e in read_events(files.dir / "events.jsonl")
              if e.type == "eval.finished" and e.data.get("check") == "heldout"]
    assert "ERR_NVGPUCTRPERM" in checks[0].data["observed"]["error"]
    assert checks[0].data["result"]["verdict"] == "ok"
    files.close()
