"""`--workers`, `--cluster` and `--branches` end to end: bad input is one line and exit 2 before a session exists, and
a run on two CPU slots killed with evaluations in flight resumes with every one of them re-queued once."""

from __future__ import annotations

import json
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_cli_e2e import ROOT, offline_env, one_line_error, read_journal, wb

FAKE_NVIDIA_SMI = """#!/bin/sh
# Two idle H200s, as nvidia-smi lists them (the queries workbench.fleet.gpus makes).
case "$*" in
  *query-gpu=index,uuid,name,memory.used*) printf '0, GPU-aaaa, NVIDIA H200, 0\\n1, GPU-bbbb, NVIDIA H200, 0\\n' ;;
  *query-compute-apps*) ;;
  *name*) printf 'NVIDIA H200\\nNVIDIA H200\\n' ;;
  *) printf 'GPU 0: NVIDIA H200\\nGPU 1: NVIDIA H200\\n' ;;
esac
"""


def two_gpus(tmp_path: Path) -> dict[str, str]:
    """An environment whose nvidia-smi reports two GPUs (the CUDA code paths are never reached)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = offline_env()
    return {"PATH": f"{bin_dir}:{env['PATH']}"}


def no_session_made(sessions: Path) -> bool:
    return not sessions.exists() or not any(sessions.iterdir())


def test_more_workers_than_gpus_is_one_line_before_a_session(tmp_path):
    sessions = tmp_path / "s"
    proc = wb("run", "softmax", "--headless", "--device", "cuda", "--workers", "3", "--sessions-dir", str(sessions),
              env=two_gpus(tmp_path), timeout=60)
    line = one_line_error(proc, 2)
    assert "--workers 3: this host has 2 free GPUs (2 visible)" in line
    assert no_session_made(sessions)


def test_workers_and_branches_out_of_range_are_usage_errors(tmp_path):
    sessions = tmp_path / "s"
    assert "--workers must be a positive number, got 0" in one_line_error(
        wb("run", "softmax", "--headless", "--device", "cpu", "--workers", "0", "--sessions-dir", str(sessions)), 2)
    assert "the tuner agent holds no conversation to branch" in one_line_error(
        wb("run", "softmax", "--headless", "--device", "cpu", "--agent", "tuner", "--branches", "2",
           "--sessions-dir", str(sessions)), 2)
    assert no_session_made(sessions)


def test_cluster_ray_without_ray_names_the_extra(tmp_path):
    shim = tmp_path / "shim" / "ray"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    sessions = tmp_path / "s"
    proc = wb("run", "softmax", "--headless", "--device", "cpu", "--cluster", "ray", "--sessions-dir", str(sessions),
              env={"PYTHONPATH": f"{shim.parent}:{ROOT}"})
    line = one_line_error(proc, 2)
    assert "--cluster ray needs Ray, which is not installed here" in line and "pip install -e '.[cluster]'" in line
    assert no_session_made(sessions)


def test_a_ray_address_that_does_not_answer_is_one_line_before_a_session(tmp_path):
    pytest.importorskip("ray")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sessions = tmp_path / "s"
    started = time.monotonic()
    proc = wb("run", "softmax", "--headless", "--device", "cpu", "--cluster", "ray", "--sessions-dir", str(sessions),
              env={"RAY_ADDRESS": f"127.0.0.1:{port}"}, timeout=60)
    line = one_line_error(proc, 2)
    assert f"the Ray cluster at 127.0.0.1:{port} does not answer" in line and "ray start --head" in line
    assert time.monotonic() - started < 30
    assert no_session_made(sessions)


@pytest.mark.slow
def test_two_cpu_slots_killed_mid_evaluation_resume_with_each_interrupted_job_requeued(tmp_path):
    sessions = tmp_path / "sessions"
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "run", "softmax", "--headless", "--device", "cpu",
                             "--workers", "2", "--sessions-dir", str(sessions)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env=offline_env())
    session_id = proc.stdout.readline().strip()
    journal = sessions / session_id / "events.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # kill once both slots are evaluating, after one result is in
        events = read_journal(journal) if journal.exists() else []
        running = {e["data"]["job"] for e in events if e["type"] == "eval.started"} - \
            {e["data"].get("job") for e in events if e["type"] in ("eval.finished", "eval.failed")}
        if any(e["type"] == "eval.finished" for e in events) and len(running) == 2:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("never had two evaluations in flight")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    before = read_journal(journal)
    started = [e for e in before if e["type"] == "run.started"]
    assert started[0]["data"]["workers"] == 2 and [s["slot"] for s in started[0]["data"]["slots"]] == ["cpu:0", "cpu:1"]
    ended = {e["data"].get("job") for e in before if e["type"] in ("eval.finished", "eval.failed")}
    interrupted = {e["data"]["job"]: e["data"]["attempt"] for e in before if e["type"] == "eval.queued"
                   and e["data"]["job"] not in ended}
    assert len(interrupted) >= 2

    evaluated = len({e["data"]["attempt"] for e in before if e["type"] == "eval.finished"})
    resumed = wb("resume", session_id, "--headless", "--max-iterations", str(evaluated + len(interrupted)),
                 "--sessions-dir", str(sessions))
    assert resumed.returncode == 0, resumed.stderr
    after = read_journal(journal)
    assert after[: len(before)] == before and [e["seq"] for e in after] == list(range(1, len(after) + 1))
    new = after[len(before):]
    assert new[0]["type"] == "run.started" and new[0]["data"]["workers"] == 2, "the resume keeps the two slots"
    requeued = {e["data"]["requeue_of"]: e["data"]["attempt"] for e in new if e["data"].get("requeue_of")}
    assert requeued == interrupted, "each interrupted evaluation queued again, once"
    judged = [e["data"]["attempt"] for e in after if e["type"] == "eval.finished" and "check" not in e["data"]]
    assert sorted(judged) == sorted(set(judged)), "no attempt judged twice"
    assert set(interrupted.values()) <= set(judged)
    written = [e["data"]["attempt"] for e in after if e["type"] == "attempt.written"]
    assert written == sorted(set(written)), "no attempt number is reused"
    show = json.loads(wb("show", session_id, "--json", "--sessions-dir", str(sessions)).stdout)
    assert show["status"] == "stopped" and show["best"] is not None
    queued = {e["data"]["job"] for e in after if e["type"] == "eval.queued"}
    closed = {e["data"]["job"] for e in after if e["type"] in ("eval.finished", "eval.failed")} | set(requeued)
    assert queued == closed, "no evaluation left open"
