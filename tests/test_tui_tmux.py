"""End to end in a real tmux: run softmax in the TUI, kill -9 it mid-run, resume it, and the same session carries on."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from run_processes import candidate_started, run_processes, slow_kernel
from workbench.fleet.gpus import own_pids
from workbench.journal import read_events
from workbench.session.state import fold

REPO = Path(__file__).resolve().parents[1]
SIZE = ("120", "40")
SESSION_ID = re.compile(r"\d{8}-\d{6}-softmax-[0-9a-f]{4}")
ATTEMPT = re.compile(r"│ attempt (\d+)")

pytestmark = pytest.mark.slow


CONFIG = f"""\
set -g default-size {SIZE[0]}x{SIZE[1]}
set -s escape-time 10
"""
"""The server's whole configuration (the person's ~/.tmux.conf is not read): with no client attached a window takes
default-size, which -x/-y alone do not set in tmux 3.3; escape-time as the README recommends."""


class Tmux:
    """A private tmux server (its own socket and config), so the test never touches the person's own sessions."""

    def __init__(self, socket: Path, config: Path) -> None:
        self.socket = socket
        self.config = config
        self.started: list[int] = []
        """Processes the workbench started (evaluator children): killed by pid when the test ends."""

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-S", str(self.socket), "-f", str(self.config), *args], capture_output=True,
                              text=True, check=check, timeout=20)

    def start(self, name: str, env: dict[str, str], *argv: str) -> None:
        """A detached session of fixed size running `python -m workbench argv` directly (the pane's pid is ours)."""
        flags = [item for key, value in env.items() for item in ("-e", f"{key}={value}")]
        self("new-session", "-d", "-s", name, "-x", SIZE[0], "-y", SIZE[1], "-c", str(REPO), *flags,
             sys.executable, "-m", "workbench", *argv)

    def alive(self, name: str) -> bool:
        return self("has-session", "-t", name, check=False).returncode == 0

    def screen(self, name: str) -> str:
        return self("capture-pane", "-p", "-t", name).stdout

    def pid(self, name: str) -> int:
        return int(self("display-message", "-p", "-t", name, "#{pane_pid}").stdout.strip())

    def wait(self, name: str, predicate: Callable[[str], bool], timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            if not self.alive(name):
                raise AssertionError(f"the workbench in tmux exited while waiting for {what}; last screen:\n{text}")
            text = self.screen(name)
            if predicate(text):
                return text
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; the screen was:\n{text}")


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the evaluator's children run in their own process groups, so a group kill misses them)."""
    return sorted(own_pids(pid) - {pid})


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    config = tmp_path / "tmux.conf"
    config.write_text(CONFIG, encoding="utf-8")
    server = Tmux(tmp_path / "tmux.sock", config)
    try:
        yield server
    finally:
        server("kill-server", check=False)
        kill(server.started)


def test_run_killed_in_tmux_resumes_as_the_same_session(tmux: Tmux, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('theme = "workbench-ansi"\ncursor_blink = false\n', encoding="utf-8")
    # Under pytest the pane's environment arrives with COLUMNS=80 and LINES=24, which Textual obeys over the pty's
    # real size; stating the window's size keeps the layout the one a person at 120x40 sees.
    env = {"PYTHONPATH": str(REPO), "WORKBENCH_CONFIG": str(config), "ANTHROPIC_API_KEY": "",
           "COLUMNS": SIZE[0], "LINES": SIZE[1]}
    sessions = tmp_path / "sessions"

    tmux.start("run", env, "run", "softmax", "--agent", "tuner", "--device", "cpu", "--sessions-dir", str(sessions))
    screen = tmux.wait("run", lambda s: bool(ATTEMPT.search(s)) and "evaluation · attempt" in s and
                       SESSION_ID.search(s) is not None, 120, "an evaluated attempt on the live screen")
    found = SESSION_ID.search(screen)
    assert found is not None and "softmax" in screen and "RUNNING" in screen
    session_id = found.group(0)

    pid = tmux.pid("run")
    below = descendants(pid)
    tmux.started.extend(below)
    os.kill(pid, signal.SIGKILL)  # no clean stop: what a dropped SSH link or an OOM kill does
    kill(below)
    deadline = time.monotonic() + 10
    while tmux.alive("run") and time.monotonic() < deadline:
        time.sleep(0.1)

    journal = sessions / session_id / "events.jsonl"
    before = fold(e.to_dict() for e in read_events(journal))
    assert before.status == "running", "a killed run never journals run.stopped"
    written = max(before.attempts)

    tmux.start("resume", env, "resume", session_id, "--sessions-dir", str(sessions))
    screen = tmux.wait("resume", lambda s: session_id in s and any(int(n) > written for n in ATTEMPT.findall(s)),
                       120, f"attempt {written + 1} or later of {session_id}")
    assert "softmax" in screen and "tuner" in screen
    tmux.started.extend(descendants(tmux.pid("resume")))

    tmux("send-keys", "-t", "resume", "q")
    deadline = time.monotonic() + 60
    while tmux.alive("resume") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not tmux.alive("resume"), "q must stop the resumed run at its next step boundary"

    events = [e.to_dict() for e in read_events(journal)]
    after = fold(events)
    assert after.id == session_id and after.status == "stopped" and max(after.attempts) > written
    assert [e["type"] for e in events].count("run.started") == 2 and events[-1]["type"] in (
        "run.stopped", "checkpoint.written")
    resumed_at = max(i for i, e in enumerate(events) if e["type"] == "run.started")
    aborted = {e["data"]["call_id"] for e in events[resumed_at:] if e["type"] == "tool.result" and
               e["data"].get("aborted")}
    assert aborted == set(before.in_flight), "a tool call the kill interrupted is closed as aborted on resume"


@pytest.mark.parametrize("how", ["SIGTERM", "hangup"])
def test_sigterm_and_a_hangup_stop_a_tui_run_as_they_stop_a_headless_one(how: str, tmux: Tmux, tmp_path: Path) -> None:
    """Textual handles neither signal; by default each ended the TUI at once, with no run.stopped."""
    config = tmp_path / "config.toml"
    config.write_text('theme = "workbench-ansi"\ncursor_blink = false\n', encoding="utf-8")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {"PYTHONPATH": str(REPO), "WORKBENCH_CONFIG": str(config), "ANTHROPIC_API_KEY": "", "TMPDIR": str(tmpdir),
           "WORKBENCH_KERNELS": str(REPO / "tests" / "fixtures" / "tasks"), "COLUMNS": SIZE[0], "LINES": SIZE[1]}
    sessions = tmp_path / "sessions"
    tmux.start("run", env, "run", "tiny", "--agent", "tuner", "--device", "cpu", "--start",
               str(slow_kernel(tmp_path / "slow.py")), "--sessions-dir", str(sessions))
    pid = tmux.pid("run")
    try:
        deadline = time.monotonic() + 120
        while not candidate_started(tmpdir):
            assert tmux.alive("run") and time.monotonic() < deadline, "no evaluation began"
            time.sleep(0.1)
        time.sleep(1.0)  # the candidate is in its never-ending forward
        if how == "SIGTERM":
            os.kill(pid, signal.SIGTERM)
        else:
            tmux("kill-session", "-t", "run")  # closes the pane's terminal: SIGHUP, then EIO on every write
        deadline = time.monotonic() + 20
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{pid}").exists(), f"the TUI did not exit after {how}"
        end = time.monotonic() + 1.0
        while run_processes(tmpdir) and time.monotonic() < end:
            time.sleep(0.05)
        assert run_processes(tmpdir) == [], "no process of the run outlives it"
    finally:
        kill(run_processes(tmpdir))
    (journal,) = sessions.glob("*/events.jsonl")
    events = [e.to_dict() for e in read_events(journal)]
    reason = "stopped by signal SIGTERM" if how == "SIGTERM" else "stopped by signal SIGHUP (the terminal hung up)"
    assert [e["type"] for e in events[-2:]] == ["run.stopped", "checkpoint.written"]
    queued = [e["data"]["job"] for e in events if e["type"] == "eval.queued"]
    assert events[-2]["data"] == {"reason": reason, "final": False, "interrupted": queued}
    assert queued and not [e for e in events if e["type"] in ("eval.finished", "eval.failed")], \
        "the evaluation in flight was aborted, judged nothing, and is named in run.stopped"
