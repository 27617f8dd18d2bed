"""Candidate processes forked from a template: a child's session, exit status and environment, the template's death
(between and during evaluations), a template that cannot start, and nothing of one candidate in the next."""

import json
import os
import signal
from pathlib import Path

import pytest
from waiting import wait_until

from workbench.evaluator import EvaluationService, forked, wire
from workbench.evaluator.prestart import WorkerProcess, kill_group, status
from workbench.tasks import load_task

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "kernels" / "softmax" / "seed.py"
CASES = ROOT / "workbench" / "evaluator" / "selftest_cases" / "softmax"
pytestmark = pytest.mark.skipif(not forked.templates_wanted() or not Path("/proc/self/stat").exists(),
                                reason="forks from a template and reads /proc")




def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # state, ppid, pgrp, session, ...


@pytest.fixture()
def template(monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEST_API_KEY", "sk-template-secret")
    made = forked.Template("cpu", netns=True)
    yield made
    made.close()


def test_a_forked_child_is_a_candidate_process_in_its_own_session_with_its_status_relayed(template):
    worker = WorkerProcess("cpu", template=template)
    try:
        assert worker.start_note == f"forked from template {template.pid}"
        state, ppid, pgrp, session = _stat(worker.pid)[:4]
        assert int(ppid) == template.pid and int(pgrp) == int(session) == worker.pid, "its own session and group"
        for pid in (worker.pid, template.pid):
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            assert b"sk-template-secret" not in environ and b"WORKBENCH_TEST_API_KEY" not in environ
            assert b"TRITON_INTERPRET=1" in environ
        worker.warm()
        ready = json.loads(wire.read_frame(worker.service_fds[1], 1 << 20))
        assert ready["ready"] and ready["start"] == "forked" and ready["template"] == template.pid
        if ready["netns"]:  # one namespace per child, not the template's shared by all
            assert os.readlink(f"/proc/{worker.pid}/ns/net") not in (os.readlink(f"/proc/{template.pid}/ns/net"),
                                                                     os.readlink("/proc/self/ns/net"))
        assert status(worker.proc) is None
        os.kill(worker.pid, signal.SIGTERM)
        assert wait_until(lambda: status(worker.proc) is not None, 10)
        assert status(worker.proc) == -signal.SIGTERM, "Popen's convention"
        assert _stat(worker.pid)[0] == "Z", "kept unreaped (its pid and group id reserved) until the owner lets go"
        kill_group(worker.proc)
        assert wait_until(lambda: _stat(worker.pid) is None, 10), "the template reaps it once released"
    finally:
        worker.discard()


def test_an_exit_status_and_a_group_kill_of_a_waiting_child(template):
    exits = WorkerProcess("cpu", template=template)
    waits = WorkerProcess("cpu", template=template)
    try:
        exits.configure(json.dumps({"device": "cuda"}).encode())  # the wrong device: it exits with status 2
        assert exits.proc.wait(30) == 2 and status(exits.proc) == 2
        kill_group(waits.proc)
        assert waits.proc.returncode == -signal.SIGKILL and not waits.alive()
        assert template.alive(), "children come and go, the template stays"
    finally:
        exits.discard()
        waits.discard()


def test_the_next_evaluation_runs_when_the_template_died_between_candidates():
    with EvaluationService(load_task("softmax"), "cpu", prepare_heldout=False) as service:
        first = service.evaluate(SEED)
        old = service._prestarter.template
        os.kill(old.pid, signal.SIGKILL)  # the waiting child dies with it (its death signal)
        assert wait_until(lambda: not service._prestarter.waiting.alive(), 10)
        second = service.evaluate(SEED)
        third = service.evaluate(SEED)
        health = service.health()
    assert first["verdict"] == second["verdict"] == third["verdict"] == "ok", second["message"]
    assert first["isolation"]["start"] == f"forked from template {old.pid}"
    new = service._prestarter.template
    assert second["isolation"]["start"] == third["isolation"]["start"] == f"forked from template {new.pid}"
    assert new.pid != old.pid and health.restarts == 0 and third["prestarted"] is True


def test_a_candidate_whose_template_dies_mid_evaluation_is_a_crash_and_the_next_one_runs():
    with EvaluationService(load_task("softmax"), "cpu", prepare_heldout=False) as service:
        victim = service._prestarter.template.pid

        def kill_template(stage):
            if stage.get("stage") == "load":  # the candidate's own step: what a candidate killing its parent does
                try:
                    os.kill(victim, signal.SIGKILL)
                except ProcessLookupError:
                    pass

        crashed = service.evaluate(SEED, on_stage=kill_template)
        after = service.evaluate(SEED)
        health = service.health()
    assert crashed["verdict"] == "crash", crashed["message"]
    assert "SIGKILL" in crashed["message"] and "its template process died" in crashed["message"]
    assert after["verdict"] == "ok", after["message"]
    assert after["isolation"]["start"].startswith("forked from template ") and str(victim) not in \
        after["isolation"]["start"]
    assert health.restarts == 0, "the service itself was not touched"


def test_a_template_that_cannot_start_falls_back_to_fresh_interpreters(monkeypatch):
    monkeypatch.setattr(forked, "TEMPLATE_MODULE", "workbench.evaluator.no_such_template")
    with EvaluationService(load_task("softmax"), "cpu", prepare_heldout=False) as service:
        results = [service.evaluate(SEED) for _ in range(2)]
        health = service.health()
        starts = service._prestarter.template_starts
    assert [r["verdict"] for r in results] == ["ok", "ok"], results[0]["message"]
    for result in results:
        start = result["isolation"]["start"]
        assert start.startswith("fresh interpreter (no template: template ") and "no_such_template" in start, start
    assert "no_such_template" in health.template
    assert starts <= 4, "restarts are bounded"


def test_templates_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(forked.NO_TEMPLATE_ENV, "1")
    with EvaluationService(load_task("softmax"), "cpu", prepare_heldout=False) as service:
        result = service.evaluate(SEED)
        assert service._prestarter.template is None and service.health().template == "off"
    assert result["verdict"] == "ok" and result["isolation"]["start"] == "fresh interpreter"
    assert forked.report_line().startswith("candidates  fresh interpreters (switched off)")


def test_a_second_candidate_sees_nothing_the_first_left(tmp_path):
    seed = SEED.read_text()
    first = tmp_path / "leaves_state.py"
    first.write_text("import triton\nimport torch\ntriton.left_by_first = 1\ntorch.left_by_first = 1\n" + seed)
    second = tmp_path / "looks_for_state.py"
    second.write_text(seed + "\n\nimport sys as _sys\nimport torch as _torch\nimport triton as _triton\n"
                      "if hasattr(_triton, 'left_by_first') or hasattr(_torch, 'left_by_first') or any(\n"
                      "        'leaves_state' in m for m in _sys.modules):\n"
                      "    raise RuntimeError('state of the first candidate is visible')\n"
                      "del _sys, _torch, _triton\n")
    with EvaluationService(load_task("softmax"), "cpu", prepare_heldout=False) as service:
        one = service.evaluate(first, static_guards=False)
        service.evaluate(SEED)  # the next child was forked during the first evaluation: look two children later
        two = service.evaluate(second, static_guards=False)
    assert one["verdict"] == "ok", one["message"]
    assert two["verdict"] == "ok", two["message"]
    assert one["isolation"]["start"] == two["isolation"]["start"]


def test_doctor_says_candidates_are_forked_from_a_template():
    line = forked.report_line()
    assert line.startswith("candidates  forked from a pre-imported template (template "), line


OWNER = """\
import time
from workbench.evaluator.prestart import Prestarter
pool = Prestarter("cpu")
pool.replenish()
print(pool.template.pid, pool.waiting.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def test_the_template_and_its_children_die_with_their_owner():
    import subprocess
    import sys

    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    template = child = 0
    try:
        template, child = (int(x) for x in owner.stdout.readline().split())
        assert _alive(template) and _alive(child)
        os.kill(template, signal.SIGSTOP)  # a busy template would not read its socket's end either
        owner.send_signal(signal.SIGKILL)  # no code of the owner runs: only the death signals can end them
        owner.wait(10)
        assert wait_until(lambda: not _alive(template) and not _alive(child), 5), "they outlived their owner"
    finally:
        owner.kill()
        for pid in (template, child):
            try:
                if pid:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_started_cuda_driver_is_seen_by_its_threads():
    """The template refuses to fork once the CUDA driver runs (its threads are named cuda-...), not merely because
    a library mapped libcuda or numpy's BLAS pool runs threads."""
    import threading

    from workbench.evaluator import template

    before = template._cuda_threads()
    named, done = threading.Event(), threading.Event()

    def driver_like() -> None:
        with open("/proc/thread-self/comm", "w") as comm:
            comm.write("cuda-EvtHandlr")
        named.set()
        done.wait(10)

    thread = threading.Thread(target=driver_like)
    thread.start()
    try:
        assert named.wait(10)
        assert template._cuda_threads() == before + 1
    finally:
        done.set()
        thread.join()
    # join() returns before the OS has removed the thread from /proc/self/task
    assert wait_until(lambda: template._cuda_threads() == before, 10)
