"""The runtime on a pool of several slots: evaluations in flight, results in any order, the journal as the truth.

The pools here are the fleet's own LocalPool with runner doubles (a fake evaluation with a chosen duration), so the
order in which results come back is set by the test; the LLM tests use the real anthropic client against the local
fake Messages API.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from workbench.agent.backends.tuner import TunerBackend
from workbench.agent.budget import Budget
from workbench.agent.commands import Command
from workbench.agent.evaluation import Evaluations, EvaluationsError
from workbench.agent.runtime import AgentRuntime
from workbench.agent.sink import RecordingSink
from workbench.agent.tunables import read_declared
from workbench.fleet.api import EvalJob, SlotInfo
from workbench.fleet.local import LocalPool, SlotFault
from workbench.journal import read_events
from workbench.session import SessionStore
from workbench.session.replay import load_state
from workbench.session.state import SessionState, apply

from test_runtime import SEED

TASK = SimpleNamespace(name="toy", public_view=lambda: {"name": "toy"})


def variant(block: int) -> str:
    return SEED.replace('"BLOCK": 1,', f'"BLOCK": {block},')


def speed_of(config: dict[str, Any]) -> float:
    return config["BLOCK"] * config["num_warps"] / 4


class Runner:
    """A slot runner double: the toy speed model, after `delay(config)` seconds, with the slot's own bias."""

    def __init__(self, name: str, calls: list, delay: Callable[[dict], float] = lambda c: 0.0, bias: float = 1.0,
                 gate: threading.Event | None = None) -> None:
        self.name, self.calls, self.delay, self.bias, self.gate = name, calls, delay, bias, gate

    def run(self, job: EvalJob) -> dict[str, Any]:
        if self.gate is not None:
            assert self.gate.wait(10), "the test never released this slot"
        config = read_declared(job.path.read_text()).config
        self.calls.append((self.name, job.attempt, job.kind))
        time.sleep(self.delay(config))
        speed = speed_of(config) * self.bias
        result = {"verdict": "ok", "message": "", "speedup": speed, "timing_comparable": True,
                  "shapes": [{"name": "S1", "correct": True, "ms": 1 / speed, "speedup": speed}]}
        if job.heldout:
            result["heldout"] = [{"name": "H1", "correct": True}]
        return result

    def close(self) -> None:
        pass


def pool_of(*runners: Runner) -> LocalPool:
    return LocalPool([(SlotInfo(r.name, "cpu"), r) for r in runners])


def new_session(tmp_path: Path, budget: Budget, pool: LocalPool, backend=None) -> tuple[AgentRuntime, Any]:
    files = SessionStore(tmp_path).create(task="toy", agent="tuner", model=None, device="cpu", budget=budget.to_dict())
    runtime = AgentRuntime(files, SessionState(), TASK, backend or TunerBackend(SEED), device="cpu", budget=budget,
                           pool=pool, checkpoint_every=50)
    runtime.emit("session.created", {"id": files.id, "task": "toy", "agent": "tuner", "device": "cpu",
                                     "budget": budget.to_dict()})
    return runtime, files


def journal(files) -> list:
    return list(read_events(files.dir / "events.jsonl"))


def in_flight_over_time(events) -> list[int]:
    """Candidate jobs open after each event, replayed from the journal."""
    open_jobs: set[str] = set()
    counts = []
    for e in events:
        if e.type == "eval.queued" and e.data["kind"] == "candidate":
            open_jobs.discard(e.data.get("requeue_of", ""))
            open_jobs.add(e.data["job"])
        elif e.type in ("eval.finished", "eval.failed"):
            open_jobs.discard(e.data.get("job", ""))
        counts.append(len(open_jobs))
    return counts


def test_the_tuner_keeps_one_config_per_slot_in_flight_takes_results_in_any_order_and_converges(tmp_path):
    calls: list = []
    slow = {"BLOCK": 2, "num_warps": 1}  # the first neighbour proposed: it finishes after the one proposed next
    pool = pool_of(Runner("cpu:0", calls, lambda c: 0.3 if c == slow else 0.0),
                   Runner("cpu:1", calls, lambda c: 0.3 if c == slow else 0.0))
    runtime, files = new_session(tmp_path, Budget(), pool)
    assert runtime.run(threading.Event()) == "search space exhausted"
    state, events = runtime.state, journal(files)
    assert len(state.attempts) == 12 and len({tuple(sorted(a.params.items())) for a in state.attempts.values()}) == 12
    assert state.best_attempt.params == {"BLOCK": 8, "num_warps": 4} and state.best_attempt.confirmed is True
    counts = in_flight_over_time(events)
    assert max(counts) == 2, "two slots: never more than two candidates in flight, and two at some point"
    finished = [e.data["attempt"] for e in events if e.type == "eval.finished" and "check" not in e.data]
    started = [e.data["attempt"] for e in events if e.type == "eval.started"]
    slow_n = next(a.n for a in state.attempts.values() if a.params == slow)
    assert finished.index(slow_n) > finished.index(slow_n + 1), "a later proposal's result came back first"
    assert started.index(slow_n + 1) < finished.index(slow_n) + len(started)  # it started while the slow one ran
    assert {e.data["slot"]["slot"] for e in events if e.type == "eval.started"} == {"cpu:0", "cpu:1"}
    assert sorted(n for _, n, kind in calls if kind == "candidate") == list(range(1, 13)), "each config ran once"
    assert not state.jobs and not state.in_flight
    files.close()


def test_the_sink_hears_of_every_job_at_once_and_of_phases_at_most_twice_a_second(tmp_path):
    calls: list = []
    box: list = []

    class Stepping(Runner):
        def run(self, job):
            for i in range(60):  # an evaluation that reports a step every 25 ms for 1.5 s
                box[0].set_phase(self.name, f"step {i}")
                time.sleep(0.025)
            return super().run(job)

    pool = pool_of(Stepping("cpu:0", calls))
    box.append(pool)
    runtime, files = new_session(tmp_path, Budget(max_iterations=1), pool)
    sink = RecordingSink()
    runtime.run(threading.Event(), queue.Queue(), sink)
    jobs = [v.slots[0].job.id if v.slots[0].job else "" for v in sink.fleets]
    started = [e.data["job"] for e in sink.events if e.type == "eval.started"]
    assert all(job in jobs for job in started), "every job taken is reported"
    phases = [(v.slots[0].job.id, v.slots[0].phase) for v in sink.fleets if v.slots[0].job and v.slots[0].phase]
    per_job = {job: sum(1 for j, _ in phases if j == job) for job in started}
    # 1.5 s of steps: three or four views each (the loop looks every 0.2 s, so unthrottled it would send seven)
    assert all(1 <= n <= 4 for n in per_job.values()), per_job
    files.close()


def test_max_iterations_is_not_overshot_with_several_slots_busy(tmp_path):
    calls: list = []
    pool = pool_of(*(Runner(f"cpu:{i}", calls, lambda c: 0.05) for i in range(3)))
    runtime, files = new_session(tmp_path, Budget(max_iterations=4), pool)
    assert runtime.run(threading.Event()).startswith("budget: max iterations (4)")
    assert runtime.state.evaluated == 4 and len(runtime.state.attempts) == 4
    assert len([c for c in calls if c[2] == "candidate"]) == 4
    files.close()


def evaluations_on(tmp_path: Path, pool: LocalPool, sources: dict[int, str]):
    """Evaluations over `pool` for a session holding `sources` as attempts (no runtime)."""
    files = SessionStore(tmp_path).create(task="toy", agent="tuner", model=None, device="cpu", budget={})
    state = SessionState()

    def emit(kind, data):
        event = files.journal.append(kind, data)
        apply(state, event.to_dict())
        return event

    def path_of(n):
        if not files.attempt_dir(n).exists():
            files.write_attempt(n, kernel=state.attempts[n].source, parent_kernel=None, parent=None)
        return files.attempt_dir(n) / "kernel.py"

    for n, source in sources.items():
        emit("attempt.written", {"attempt": n, "sha256": str(n), "source": source, "params": {}})
    return Evaluations(pool, task=TASK, state=state, files=files, emit=emit, attempt_path=path_of), state, files


def test_a_new_best_stands_only_once_confirmed_on_the_reference_slot_and_takes_its_timings(tmp_path):
    calls: list = []
    release = threading.Event()
    reference = Runner("cpu:0", calls, gate=release)
    pool = pool_of(reference, Runner("cpu:1", calls, bias=1.25))
    evals, state, files = evaluations_on(tmp_path, pool, {1: variant(4)})
    assert evals.reference == "cpu:0"
    pool.submit(EvalJob("busy", 0, tmp_path / "none.py", "", slot="cpu:0"))  # someone else's work holds the slot
    evals.request(1)
    deadline = time.monotonic() + 10
    while not (state.attempts[1].confirming and state.jobs) and time.monotonic() < deadline:
        evals.drain(0.05)
    attempt = state.attempts[1]
    assert attempt.verdict == "ok" and attempt.slot == "cpu:1" and attempt.speedup == 1.25
    assert state.best is None, "not the best before the reference slot confirmed it"
    (check,) = state.jobs.values()
    assert check["kind"] == "heldout" and check["slot"] == "cpu:0"
    release.set()
    while not evals.final(1) and time.monotonic() < deadline:
        evals.drain(0.05)
    assert state.best == 1 and attempt.confirmed is True
    assert attempt.slot == "cpu:0" and attempt.speedup == 1.0, "a best is timed on the reference GPU"
    assert ("cpu:0", 1, "heldout") in calls
    evals.close()
    files.close()


class FaultsOnce(Runner):
    """A slot whose trusted side fails under its first job (a CUDA context fault, no result)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.faulted = False

    def run(self, job: EvalJob) -> dict[str, Any]:
        if not self.faulted:
            self.faulted = True
            raise SlotFault(f"{self.name}: the CUDA context faulted")
        return super().run(job)


def test_a_job_whose_slot_faults_under_it_is_journaled_as_moved_and_finishes_on_the_other_slot(tmp_path):
    calls: list = []
    release = threading.Event()
    pool = pool_of(FaultsOnce("cpu:0", calls), Runner("cpu:1", calls, gate=release))
    evals, state, files = evaluations_on(tmp_path, pool, {1: variant(2)})
    pool.submit(EvalJob("busy", 0, tmp_path / "none.py", "", slot="cpu:1"))  # someone else's work holds cpu:1
    evals.request(1)
    settle_until(evals, lambda: any(e.type == "eval.requeued" for e in journal(files)))
    assert state.slots["cpu:0"]["job"] == "" and state.slots["cpu:0"]["state"] == "faulted"
    (job,) = state.jobs.values()
    assert "slot_taken" not in job, "the job waits for a slot again"
    release.set()
    settle_until(evals, lambda: evals.final(1))
    def where(data):  # eval.queued names a pinned slot, the others the slot's data
        return data.get("slot") if not isinstance(data.get("slot"), dict) else data["slot"]["slot"]

    kinds = [(e.type, where(e.data)) for e in journal(files) if e.type.startswith(("eval.", "fleet."))]
    assert kinds[:5] == [("eval.queued", None), ("eval.started", "cpu:0"), ("fleet.slot", "cpu:0"),
                         ("eval.requeued", "cpu:0"), ("eval.started", "cpu:1")]
    assert ("eval.finished", "cpu:1") in kinds and state.attempts[1].verdict == "ok"
    moved = next(e for e in journal(files) if e.type == "eval.requeued")
    assert moved.data["attempt"] == 1 and "CUDA context faulted" in moved.data["message"]
    evals.close()
    files.close()


def settle_until(evals, predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        evals.drain(0.05)
    assert predicate(), "timed out"


def test_the_reference_slot_checks_the_fastest_candidate_first_and_the_next_one_when_that_check_fails(tmp_path):
    calls: list = []
    gate = threading.Event()

    class Overfits(Runner):
        def run(self, job):
            out = super().run(job)
            if job.heldout and read_declared(job.path.read_text()).config["BLOCK"] == 8:
                out["verdict"], out["message"] = "incorrect", "H1: rel_err 0.3 > 1e-5"
                out["heldout"] = [{"name": "H1", "correct": False}]
            return out

    pool = pool_of(Overfits("cpu:0", calls, gate=gate), Overfits("cpu:1", calls))
    evals, state, files = evaluations_on(tmp_path, pool, {1: variant(2), 2: variant(4), 3: variant(8)})
    pool.submit(EvalJob("busy", 0, tmp_path / "none.py", "", slot="cpu:0"))  # the reference slot is busy
    for n in (1, 2, 3):  # judged in this order on cpu:1: each faster than the last
        evals.request(n)
        settle_until(evals, lambda: state.attempts[n].verdict is not None)
    settle_until(evals, lambda: not state.attempts[1].confirming and not state.attempts[2].confirming)
    failed = [e.data for e in journal(files) if e.type == "eval.failed"]
    assert [(f["attempt"], f["message"]) for f in failed] == [
        (1, "superseded: attempt 2 (1x) is checked first"), (2, "superseded: attempt 3 (2x) is checked first")]
    assert state.attempts[3].confirming and state.best is None
    gate.set()  # attempt 3 overfits: its check fails, and attempt 2, next in speed, is checked in its place
    settle_until(evals, lambda: state.best is not None)
    assert state.best == 2 and state.attempts[2].confirmed and state.attempts[3].verdict == "incorrect"
    assert [n for _, n, kind in calls if kind == "heldout"] == [3, 2] and state.attempts[1].confirmed is False
    evals.close()
    files.close()


def test_a_retired_reference_slot_hands_its_confirmations_to_the_next_slot(tmp_path):
    calls: list = []
    hold = threading.Event()
    pool = pool_of(Runner("cpu:0", calls, gate=hold), Runner("cpu:1", calls))
    runtime, files = new_session(tmp_path, Budget(max_iterations=1), pool)
    blocker = EvalJob("held", 0, tmp_path / "none.py", "", slot="cpu:0")
    pool.submit(blocker)  # cpu:0 is busy with someone else's work: the seed runs on cpu:1
    threading.Timer(0.5, lambda: pool.mark("cpu:0", "retired", "CUDA context faulted twice")).start()
    threading.Timer(1.0, hold.set).start()  # the retired slot's last job ends (its result is not this session's)
    stop = threading.Event()
    threading.Timer(30, stop.set).start()  # a confirmation left pinned to the retired slot would wait forever
    assert runtime.run(stop).startswith("budget: max iterations (1)")
    stop.set()
    events = journal(files)
    (changed,) = [e for e in events if e.type == "fleet.slot"]
    assert changed.data["state"] == "retired" and changed.data["reference"] == "cpu:1"
    checks = [e for e in events if e.type == "eval.queued" and e.data["kind"] == "heldout"]
    assert [c.data["slot"] for c in checks] == ["cpu:0", "cpu:1"] and checks[1].data["requeue_of"] == checks[0].data["job"]
    assert runtime.state.best == 1 and runtime.state.reference == "cpu:1"
    assert runtime.state.slots["cpu:0"]["state"] == "retired" and "faulted" in runtime.state.slots["cpu:0"]["faults"][0]
    files.close()


def test_evaluations_in_flight_at_a_crash_are_requeued_on_resume_none_lost_none_run_twice(tmp_path):
    calls: list = []
    runtime, files = new_session(tmp_path, Budget(max_iterations=1), pool_of(Runner("cpu:0", calls)))
    runtime.run(threading.Event())
    # What a kill -9 leaves: attempt 2 queued and started on a slot, attempt 3 queued, and a forced re-evaluation of
    # the judged attempt 1 queued; no results.
    n2 = runtime.write_attempt(SEED.replace('"BLOCK": 1,', '"BLOCK": 2,'), note="", params={"BLOCK": 2, "num_warps": 1},
                               parent=1)
    n3 = runtime.write_attempt(SEED.replace('"BLOCK": 1,', '"BLOCK": 4,'), note="", params={"BLOCK": 4, "num_warps": 1},
                               parent=1)
    for job, n in (("j00090", n2), ("j00091", n3), ("j00092", 1)):
        runtime.emit("eval.queued", {"job": job, "attempt": n, "kind": "candidate", "heldout": False})
    runtime.emit("eval.started", {"job": "j00090", "attempt": n2, "slot": {"slot": "cpu:0", "device": "cpu"}})
    files.close()

    files = SessionStore(tmp_path).open(files.id, writer=True)
    state = load_state(files)
    assert set(state.jobs) == {"j00090", "j00091", "j00092"}
    calls.clear()
    resumed = AgentRuntime(files, state, TASK, TunerBackend(SEED), device="cpu", budget=Budget(max_iterations=3),
                           pool=pool_of(Runner("cpu:0", calls), Runner("cpu:1", calls)))
    resumed.run(threading.Event())
    events = journal(files)
    requeued = {e.data["requeue_of"]: e.data["attempt"] for e in events if e.data.get("requeue_of")}
    assert requeued == {"j00090": n2, "j00091": n3}
    aborted = [e for e in events if e.type == "eval.failed"]
    assert [(e.data["job"], e.data["cancelled"]) for e in aborted] == [("j00092", True)]
    assert sorted(n for _, n, kind in calls if kind == "candidate") == [n2, n3], "each interrupted one ran once"
    assert resumed.state.attempts[n2].verdict == "ok" and resumed.state.attempts[n3].verdict == "ok"
    written = [e.data["attempt"] for e in events if e.type == "attempt.written"]
    assert written == sorted(set(written)), "attempt numbers never reused"
    assert not resumed.state.jobs
    files.close()


def test_a_run_whose_every_slot_retires_stops_resumably_in_one_line(tmp_path):
    calls: list = []
    gate = threading.Event()
    pool = pool_of(Runner("cpu:0", calls, gate=gate))
    runtime, files = new_session(tmp_path, Budget(), pool)
    threading.Timer(0.3, lambda: pool.mark("cpu:0", "retired", "CUDA context faulted twice")).start()
    threading.Timer(0.6, gate.set).start()
    stop = threading.Event()
    threading.Timer(20, stop.set).start()  # without the error the run would wait for a slot forever
    with pytest.raises(EvaluationsError, match="every evaluation slot is out of service: cpu:0: CUDA context faulted"):
        runtime.run(stop)
    stop.set()
    assert runtime.state.status == "stopped" and runtime.state.slots["cpu:0"]["state"] == "retired"
    files.close()


def test_a_pending_best_whose_check_the_crash_lost_is_checked_on_resume(tmp_path):
    calls: list = []
    runtime, files = new_session(tmp_path, Budget(max_iterations=1), pool_of(Runner("cpu:0", calls)))
    n = runtime.write_attempt(SEED, note="seed", params={"BLOCK": 1, "num_warps": 1}, parent=None)
    runtime.emit("eval.queued", {"job": "j00001", "attempt": n, "kind": "candidate", "heldout": False})
    runtime.emit("eval.finished", {"attempt": n, "job": "j00001", "pending": True, "slot": {"slot": "cpu:0"},
                                   "result": {"verdict": "ok", "speedup": 0.25, "shapes": []}})
    runtime.evaluations.close()
    files.close()
    files = SessionStore(tmp_path).open(files.id, writer=True)
    state = load_state(files)
    assert state.attempts[n].confirming and state.best is None
    resumed = AgentRuntime(files, state, TASK, TunerBackend(SEED), device="cpu", budget=Budget(max_iterations=1),
                           pool=pool_of(Runner("cpu:0", calls)))
    resumed.run(threading.Event())
    assert [c for c in calls if c[2] == "heldout"] == [("cpu:0", n, "heldout")]
    assert resumed.state.best == n
    files.close()


# -- the LLM backends ----------------------------------------------------------------------------------------
anthropic = pytest.importorskip("anthropic")
from fake_anthropic import KEY, FakeAnthropic, Message, all_text, text, tool_use  # noqa: E402

from workbench.agent.backends.claude import claude_backend  # noqa: E402
from workbench.agent.context import context_at  # noqa: E402


def claude(server):
    client = anthropic.Anthropic(api_key=KEY, base_url=server.base_url, max_retries=0)
    return claude_backend("claude-sonnet-4-6", seed_source=SEED, client=client)


def llm_session(tmp_path, backend, pool, budget=Budget()):
    files = SessionStore(tmp_path).create(task="toy", agent="claude", model="claude-sonnet-4-6", device="cpu",
                                          budget={})
    runtime = AgentRuntime(files, SessionState(), TASK, backend, device="cpu", budget=budget, pool=pool)
    runtime.emit("session.created", {"id": files.id, "task": "toy", "agent": "claude", "device": "cpu", "budget": {}})
    runtime.emit("goal.set", {"name": "toy", "device": "cpu"})
    return runtime, files


def test_one_evaluate_call_runs_several_attempts_and_each_result_reaches_the_model_as_it_comes(tmp_path):
    calls: list = []
    slow = lambda c: 1.0 if c["BLOCK"] == 4 else 0.0  # noqa: E731 - attempt 3 takes a second, attempt 2 none
    script = [
        Message([tool_use("a", "write_kernel", {"source": variant(2)}),
                 tool_use("b", "write_kernel", {"source": variant(4)})]),
        Message([tool_use("c", "evaluate", {"attempts": [2, 3]})]),  # attempt 1 is the starting kernel
        Message([text("Waiting for attempt 3.")]),
        Message([tool_use("d", "finish", {"reason": "done"})]),
    ]
    with FakeAnthropic(script) as server:
        runtime, files = llm_session(tmp_path, claude(server),
                                     pool_of(Runner("cpu:0", calls, slow), Runner("cpu:1", calls, slow)))
        assert runtime.run(threading.Event()) == "the model finished: done"
        bodies = server.requests
    assert len(bodies) == 4
    third, fourth = all_text(bodies[2]), all_text(bodies[3])
    assert "attempt 2: ok" in third and "still running: attempt 3" in third
    assert "Evaluation of attempt 3 finished" not in third
    assert "Evaluation of attempt 3 finished" in fourth and "verdict: ok" in fourth.split("attempt 3 finished")[1]
    events = journal(files)
    results = [e for e in events if e.type == "tool.result" and e.data["tool"] == "evaluate"]
    assert results[0].data["data"]["queued"] == [3]
    # show --prompt-at rebuilds what the model saw, the late result included
    last = [e for e in events if e.type == "llm.request"][-1]
    prompt, _memory, _request = context_at(events, last.seq)
    tail = prompt.messages[-1]["content"]
    assert any("Evaluation of attempt 3 finished" in b.get("text", "") for b in tail)
    files.close()


def test_branches_share_the_ledger_and_nudges_and_do_not_wait_on_each_others_model_calls(tmp_path):
    calls: list = []
    both_in = threading.Barrier(2, timeout=20)
    both_added = threading.Barrier(2, timeout=20)
    seen_first: list[int] = []

    def on_request(body, index):
        if index < 2:
            seen_first.append(index)
            both_in.wait()  # a second request while the first is still unanswered, or the barrier breaks
        elif index < 4:
            # A branch asks again only after its own ledger entry is in: once both have asked, both entries are,
            # so each branch's next request is made after the other's entry (else which one it sees is a race).
            both_added.wait()

    def script(body, index):
        if index < 2:
            return Message([tool_use(f"l{index}", "ledger", {"action": "add", "strategy": f"idea {index}"})])
        if index < 4:
            return Message([tool_use(f"r{index}", "list_attempts", {})])
        return Message([tool_use(f"f{index}", "finish", {"reason": "done"})])

    with FakeAnthropic(script, on_request=on_request) as server:
        runtime, files = llm_session(tmp_path, [claude(server), claude(server)], pool_of(Runner("cpu:0", calls)))
        commands: queue.Queue = queue.Queue()
        commands.put(Command("nudge", "keep register use low", persistent=True))
        reason = runtime.run(threading.Event(), commands)
        bodies = server.requests
    assert reason.startswith("every branch finished: branch 0: the model finished: done; branch 1:")
    assert sorted(seen_first) == [0, 1] and not both_in.broken
    first_two = [all_text(b) for b in bodies[:2]]
    assert sorted("branch 1 of 2" in t for t in first_two) == [False, True]
    assert all("keep register use low" in t for t in first_two), "the nudge reaches every branch"
    later = [all_text(b) for b in bodies[4:]]
    assert len(later) == 2 and not both_added.broken
    assert all("idea 0" in t and "idea 1" in t for t in later), "the ledger is shared"
    events = journal(files)
    requests = [e for e in events if e.type == "llm.request"]
    assert sorted(e.data["branch"] for e in requests) == [0, 0, 0, 1, 1, 1]
    assert all("branch" in e.data for e in events if e.type in ("llm.response", "tool.call", "tool.result"))
    # show --prompt-at --branch B rebuilds what B's model saw in its last request
    from fake_anthropic import plain

    for branch in (0, 1):
        prompt, _memory, request = context_at(events, events[-1].seq, branch)
        sent = next(b for b in reversed(bodies) if f"branch {branch + 1} of 2" in all_text(b))
        assert request["branch"] == branch
        assert plain(claude(server).transport.request_body(prompt, model="m", max_tokens=1)["messages"]) == \
            plain(sent["messages"])
    # each branch's window is its own, and a resume rebuilds every one of them
    files.close()
    files = SessionStore(tmp_path).open(files.id, writer=False)
    state = load_state(files)
    from workbench.agent.memory import SessionMemory

    for branch in runtime.branches:
        rebuilt = SessionMemory.load(files, state, "messages", branch=branch.number)
        assert [(e.seq, e.content) for e in rebuilt.entries] == [(e.seq, e.content) for e in branch.memory.entries]
        assert {e.seq for e in rebuilt.entries} <= {e.seq for e in events if e.data.get("branch") == branch.number}
    assert state.branches == 2
    files.close()


def test_a_model_reply_and_the_end_of_a_retrys_wait_end_the_loops_wait_at_once(tmp_path, monkeypatch):
    """The loop waits on the pool between steps; the end of a model call wakes it, and a retry is sent when its
    wait is over, whatever the idle slice."""
    import workbench.agent.runtime as runtime_module
    from fake_anthropic import Status

    monkeypatch.setattr(runtime_module, "IDLE_S", 30.0)
    script = [Status(429, "rate_limit_error", "slow down", headers={"retry-after": "0.05"})]
    script += [Message([tool_use(f"r{i}", "read_task", {})]) for i in range(3)]
    script.append(Message([tool_use("f", "finish", {"reason": "done"})]))
    with FakeAnthropic(script) as server:
        runtime, files = llm_session(tmp_path, claude(server), pool_of(Runner("cpu:0", [])))
        started = time.monotonic()
        reason = runtime.run(threading.Event(), queue.Queue())
        elapsed = time.monotonic() - started
    assert reason == "the model finished: done" and len(server.requests) == 5
    assert elapsed < 20, f"{elapsed:.1f} s: a reply or a retry waited out the loop's idle slice"
    files.close()
