"""The CLI end to end, in real processes: tasks, eval exit codes, show/sessions, nudge, kill -9 and resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "kernels" / "softmax" / "seed.py"


def offline_env(extra=None):
    """The environment of a machine with no API key: the default agent is then the offline tuner."""
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    return {**env, **(extra or {})}


def wb(*args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=offline_env(env))


def one_line_error(proc, code):
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("workbench: "), proc.stderr
    return lines[0]


def test_tasks_lists_the_shipped_tasks():
    proc = wb("tasks")
    assert proc.returncode == 0, proc.stderr
    assert "softmax" in proc.stdout


def test_usage_errors_are_one_line_exit_2(tmp_path):
    assert "unknown task" in one_line_error(wb("run", "nosuch", "--headless", "--sessions-dir", str(tmp_path)), 2)
    assert "no such file" in one_line_error(wb("eval", "softmax", str(tmp_path / "missing.py")), 2)
    assert "no session" in one_line_error(wb("show", "nosuch", "--sessions-dir", str(tmp_path)), 2)
    assert "no session" in one_line_error(wb("resume", "nosuch", "--headless", "--sessions-dir", str(tmp_path)), 2)


def test_broken_task_toml_is_one_line_exit_2(tmp_path):
    task = tmp_path / "kernels" / "broken"
    task.mkdir(parents=True)
    (task / "task.toml").write_text("name = 'broken'\nthis is not toml\n")
    proc = wb("run", "broken", "--headless", "--sessions-dir", str(tmp_path / "s"),
              env={"WORKBENCH_KERNELS": str(tmp_path / "kernels")})
    assert "task.toml" in one_line_error(proc, 2)


def test_eval_json_contract_and_exit_codes(tmp_path):
    proc = wb("eval", "softmax", str(SEED), "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for key in ("task", "file", "sha256", "device", "verdict", "message", "shapes", "speedup", "timing_comparable"):
        assert key in result
    assert result["verdict"] == "ok" and result["device"] == "cpu-interpret" and result["timing_comparable"] is False
    bad = tmp_path / "bad.py"
    bad.write_text("def forward(x):\n    return x * 0\n")
    proc = wb("eval", "softmax", str(bad), "--device", "cpu", "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["verdict"] == "incorrect"


def test_eval_progress_goes_to_stderr_and_leaves_the_json_alone():
    # A cold baseline can autotune for minutes (207.7 s on an H100): --progress says which step is running.
    proc = wb("eval", "softmax", str(SEED), "--device", "cpu", "--json", "--progress")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "ok"
    lines = proc.stderr.splitlines()
    assert lines and all(line.startswith("eval [") for line in lines), proc.stderr
    steps = [line.split("] ", 1)[1] for line in lines]
    assert "forward C1 (candidate)" in steps and "oracle C1" in steps and "timing C5 (candidate)" in steps
    assert len(steps) == len(set(steps))
    # stderr is not a terminal here, so the default is quiet (scripts and the one-line-error contract)
    quiet = wb("eval", "softmax", str(SEED), "--device", "cpu", "--json")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def read_journal(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_continues_the_same_session(tmp_path):
    sessions = tmp_path / "sessions"
    proc = subprocess.Popen([sys.executable, "-m", "workbench", "run", "softmax", "--headless", "--device", "cpu",
                             "--sessions-dir", str(sessions)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env=offline_env())
    session_id = proc.stdout.readline().strip()
    assert session_id, "the session id is printed first"
    lines = []
    while len(lines) < 2:  # two attempts evaluated, then kill during the third
        line = proc.stdout.readline()
        assert line, "run ended early"
        lines.append(line)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    journal = sessions / session_id / "events.jsonl"
    before = read_journal(journal)
    best_before = max((e for e in before if e["type"] == "eval.finished" and e["data"]["result"]["verdict"] == "ok"),
                      key=lambda e: e["data"]["result"]["speedup"])["data"]

    resumed = wb("resume", session_id, "--headless", "--max-iterations", "4", "--sessions-dir", str(sessions))
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[0] == session_id
    after = read_journal(journal)
    assert after[: len(before)] == before, "nothing journaled before the kill changed"
    assert [e["seq"] for e in after] == list(range(1, len(after) + 1))
    written = [e["data"]["attempt"] for e in after if e["type"] == "attempt.written"]
    assert written == sorted(set(written)), "no attempt number is reused"
    show = json.loads(wb("show", session_id, "--json", "--sessions-dir", str(sessions)).stdout)
    assert show["evaluated"] == 4 and show["status"] == "stopped"
    assert show["best"]["speedup"] >= best_before["result"]["speedup"]
    calls = {e["data"]["call_id"] for e in after if e["type"] == "tool.call"}
    results = {e["data"]["call_id"] for e in after if e["type"] == "tool.result"}
    assert calls == results, "every intent is closed (aborted or finished)"


def marked_processes(mark):
    """Live processes whose environment carries mark (a run's evaluator children inherit it)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if f"WB_TEST_MARK={mark}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_nudge_reaches_a_stopped_session_and_is_applied_on_resume(tmp_path):
    sessions = tmp_path / "s"
    mark = f"{os.getpid()}-{time.monotonic_ns()}"
    run = wb("run", "softmax", "--headless", "--device", "cpu", "--max-iterations", "1",
             "--sessions-dir", str(sessions), env={"WB_TEST_MARK": mark})
    assert run.returncode == 0, run.stderr
    if Path("/proc/self/environ").exists():
        # The run pre-started its next evaluation's processes; stopping the run must not leave them behind.
        deadline = time.monotonic() + 5
        while marked_processes(mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marked_processes(mark) == []
    session_id = run.stdout.splitlines()[0]
    nudge = wb("nudge", session_id, "num_warps=2", "--persistent", "--sessions-dir", str(sessions))
    assert nudge.returncode == 0, nudge.stderr
    resumed = wb("resume", session_id, "--headless", "--max-iterations", "2", "--sessions-dir", str(sessions))
    assert resumed.returncode == 0, resumed.stderr
    assert "pinning num_warps=2" in resumed.stdout
    events = read_journal(sessions / session_id / "events.jsonl")
    last = [e for e in events if e["type"] == "attempt.written"][-1]
    assert last["data"]["params"]["num_warps"] == 2


def test_the_tuner_evaluates_the_starting_kernel_once_as_attempt_1(tmp_path):
    sessions = tmp_path / "s"
    run = wb("run", "softmax", "--headless", "--device", "cpu", "--max-iterations", "2", "--sessions-dir",
             str(sessions))
    assert run.returncode == 0, run.stderr
    events = read_journal(next(sessions.glob("*/events.jsonl")))
    written = [e["data"] for e in events if e["type"] == "attempt.written"]
    assert [(w["attempt"], w["author"]) for w in written] == [(1, "start"), (2, "agent")]
    assert written[0]["source"] == SEED.read_text() and written[0]["note"] == "the task's seed.py"
    evaluated = [e["data"]["attempt"] for e in events if e["type"] == "eval.finished" and "check" not in e["data"]]
    assert evaluated == [1, 2], "the seed is evaluated once, as attempt 1"
    assert written[1]["params"] != written[0]["params"], "the tuner does not try the start's config again"


def test_second_writer_is_refused_with_one_line(tmp_path):
    sessions = tmp_path / "s"
    run = wb("run", "softmax", "--headless", "--device", "cpu", "--max-iterations", "0", "--sessions-dir", str(sessions))
    session_id = run.stdout.splitlines()[0]
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from workbench.session import SessionStore\n"
        f"f = SessionStore(Path({str(sessions)!r})).open({session_id!r}, writer=True)\n"
        "print('held', flush=True); time.sleep(60)")], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = wb("resume", session_id, "--headless", "--sessions-dir", str(sessions))
        assert proc.returncode != 0
        assert "lock" in proc.stderr.lower() and len(proc.stderr.strip().splitlines()) == 1
    finally:
        holder.kill()


def test_torn_and_corrupted_journals_are_reported_in_one_line(tmp_path):
    sessions = tmp_path / "s"
    run = wb("run", "softmax", "--headless", "--device", "cpu", "--max-iterations", "1", "--sessions-dir", str(sessions))
    assert run.returncode == 0, run.stderr
    session_id = run.stdout.splitlines()[0]
    journal = sessions / session_id / "events.jsonl"
    intact = journal.read_bytes()

    journal.write_bytes(intact[:-25])  # a crash mid-write: the last line is torn
    resumed = wb("resume", session_id, "--headless", "--max-iterations", "1", "--sessions-dir", str(sessions))
    assert resumed.returncode == 0, resumed.stderr
    assert "recovered the journal" in resumed.stderr and "torn" in resumed.stderr
    lines = journal.read_text().splitlines()
    assert [json.loads(l)["seq"] for l in lines] == list(range(1, len(lines) + 1))

    broken = bytearray(journal.read_bytes())
    at = broken.index(b'"type": "goal.set"') if b'"type": "goal.set"' in broken else broken.index(b"goal.set")
    broken[at + 3] ^= 0x01  # a flipped byte in the middle of the history
    journal.write_bytes(bytes(broken))
    proc = wb("resume", session_id, "--headless", "--sessions-dir", str(sessions))
    line = one_line_error(proc, 1)
    assert "events.jsonl:2" in line


def test_run_can_start_from_our_own_kernel_and_resume_keeps_it(tmp_path):
    """--start FILE replaces the task's seed (e.g. the shipped kernel as the bar), journaled so resume keeps it."""
    sessions = tmp_path / "s"
    start = tmp_path / "start.py"
    start.write_text(SEED.read_text().replace('"""', '"""started from a file: ', 1))
    run = wb("run", "softmax", "--headless", "--device", "cpu", "--max-iterations", "1", "--start", str(start),
             "--sessions-dir", str(sessions))
    assert run.returncode == 0, run.stderr
    session_id = run.stdout.splitlines()[0]
    events = read_journal(sessions / session_id / "events.jsonl")
    created = events[0]["data"]["start"]
    assert created["file"] == str(start.resolve()) and created["source"] == start.read_text()
    first = [e for e in events if e["type"] == "attempt.written"][0]
    assert first["data"]["source"].startswith('"""started from a file: ')
    start.unlink()  # resume must not need the file: the journal holds it
    resumed = wb("resume", session_id, "--headless", "--max-iterations", "2", "--sessions-dir", str(sessions))
    assert resumed.returncode == 0, resumed.stderr
    assert "no such file" in one_line_error(wb("run", "softmax", "--headless", "--start", str(start),
                                               "--sessions-dir", str(sessions)), 2)
    broken = tmp_path / "broken.py"
    broken.write_text("def forward(:\n")
    assert "SyntaxError" in one_line_error(wb("run", "softmax", "--headless", "--start", str(broken),
                                              "--sessions-dir", str(sessions)), 2)
