"""Signals and deaths of a headless run, in real processes: SIGTERM and a terminal hangup stop it cleanly during an
evaluation (aborted, journaled, checkpointed, resumable), and however the run dies no process of it is left (found by
the run's TMPDIR, see run_processes)."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from run_processes import candidate_started, run_processes, slow_kernel

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tests" / "fixtures" / "tasks"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc to find processes")]


class Run:
    """A `workbench run tiny --headless` on a kernel whose evaluation hangs, with a TMPDIR of its own."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        self.sessions = tmp_path / "sessions"
        self.start = slow_kernel(tmp_path / "slow.py")
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")},
                    "PYTHONPATH": str(ROOT), "WORKBENCH_KERNELS": str(TASKS), "TMPDIR": str(self.tmp)}
        self.argv = [sys.executable, "-m", "workbench", "run", "tiny", "--agent", "tuner", "--headless", "--device",
                     "cpu", "--start", str(self.start), "--sessions-dir", str(self.sessions)]

    def popen(self) -> subprocess.Popen:
        return subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def wait_for_candidate(self, alive, timeout: float = 120) -> None:
        """Until a candidate process has been handed the kernel (its private copy exists), and a moment more."""
        deadline = time.monotonic() + timeout
        while not candidate_started(self.tmp):
            assert alive(), "the run ended before its evaluation began"
            assert time.monotonic() < deadline, "no evaluation began"
            time.sleep(0.05)
        time.sleep(1.0)  # the candidate is in its never-ending forward now

    def processes(self) -> list[int]:
        """Live processes of this run."""
        return run_processes(self.tmp)

    def events(self) -> list[dict]:
        (journal,) = self.sessions.glob("*/events.jsonl")
        return [json.loads(line) for line in journal.read_text().splitlines()]

    def cleanup(self) -> None:
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def no_process_left_a_second_later(run: Run) -> None:
    deadline = time.monotonic() + 1.0
    while run.processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = run.processes()
    assert not left, "left behind: " + "; ".join(
        Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[-160:]
        for pid in left if Path(f"/proc/{pid}").exists())


def assert_stopped_by(run: Run, reason: str) -> list[str]:
    """The stop journaled with its signal, and the evaluation it aborted named in it (judged nothing); its job."""
    events = run.events()
    queued = [e["data"]["job"] for e in events if e["type"] == "eval.queued"]
    assert queued, "an evaluation was queued before the signal"
    assert not [e for e in events if e["type"] in ("eval.finished", "eval.failed")], "the aborted one judged nothing"
    assert [e["type"] for e in events[-2:]] == ["run.stopped", "checkpoint.written"]
    assert events[-2]["data"] == {"reason": reason, "final": False, "interrupted": queued}
    return queued


def test_sigterm_during_an_evaluation_aborts_it_journals_the_signal_and_the_session_resumes(tmp_path):
    run = Run(tmp_path)
    proc = run.popen()
    try:
        run.wait_for_candidate(lambda: proc.poll() is None)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
        assert proc.returncode == 0, err
        assert "stopped: stopped by signal SIGTERM" in out and took < 10, f"{took:.1f} s to stop"
        no_process_left_a_second_later(run)
        interrupted = assert_stopped_by(run, "stopped by signal SIGTERM")
        session_id = out.splitlines()[0]
        before = len(run.events())
        resumed = subprocess.run([sys.executable, "-m", "workbench", "resume", session_id, "--headless",
                                  "--max-iterations", "0", "--sessions-dir", str(run.sessions)],
                                 cwd=ROOT, env=run.env, capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0 and "budget: max iterations (0) reached" in resumed.stdout, resumed.stderr
        again = [e["data"].get("requeue_of") for e in run.events()[before:] if e["type"] == "eval.queued"]
        assert again == interrupted, "the resume queues the aborted evaluation again"
    finally:
        proc.kill()
        run.cleanup()


def test_a_terminal_hangup_stops_a_headless_run_cleanly(tmp_path):
    """The run's terminal goes away (an SSH hangup without tmux): SIGHUP, then every write to it fails."""
    run = Run(tmp_path)
    pid, master = pty.fork()
    if pid == 0:  # the child: session leader of a new terminal, as a login shell's job would be
        os.chdir(ROOT)
        os.execve(sys.executable, run.argv, run.env)
    try:
        run.wait_for_candidate(lambda: os.waitpid(pid, os.WNOHANG) == (0, 0))
        assert os.read(master, 4096).strip(), "the session id was printed on the terminal"
        sent = time.monotonic()
        os.close(master)  # the terminal hangs up: the kernel sends SIGHUP to its session
        master = -1
        deadline = time.monotonic() + 30
        while (status := os.waitpid(pid, os.WNOHANG)) == (0, 0):
            assert time.monotonic() < deadline, "the run did not stop after the hangup"
            time.sleep(0.05)
        took = time.monotonic() - sent
        assert os.waitstatus_to_exitcode(status[1]) == 0 and took < 10
        no_process_left_a_second_later(run)
        assert_stopped_by(run, "stopped by signal SIGHUP (the terminal hung up)")
    finally:
        if master >= 0:
            os.close(master)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        run.cleanup()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_no_process_of_a_run_outlives_it_however_it_dies(sig, tmp_path):
    run = Run(tmp_path)
    proc = run.popen()
    try:
        run.wait_for_candidate(lambda: proc.poll() is None)
        assert len(run.processes()) >= 3, "the run, its evaluation service and the candidate process"
        proc.send_signal(sig)
        proc.communicate(timeout=30)
        no_process_left_a_second_later(run)
    finally:
        proc.kill()
        run.cleanup()
