"""Evaluator children die with their parent, however it dies (Linux parent-death signal, armed before our code runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waiting import wait_until

from workbench.evaluator import tether

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False




PARENT = """\
import subprocess, sys, time
from workbench.evaluator import tether
kind = sys.argv[1]
argv = tether.python_argv("sleeper", "60") if kind == "module" else tether.command_argv(["sleep", "60"])
child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("kind", ["module", "command"])
def test_a_child_dies_when_its_parent_is_killed(kind, tmp_path):
    # The sleeper ignores SIGTERM and never reads its stdin, as a busy trusted process would: only the death signal
    # can end it (a new session: no terminal or process-group signal reaches it either).
    (tmp_path / "sleeper.py").write_text("import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                         "print('running', flush=True)\ntime.sleep(float(sys.argv[1]))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, kind], stdout=subprocess.PIPE, text=True, env=env)
    try:
        child = int(parent.stdout.readline())
        assert wait_until(lambda: alive(child), 10)
        time.sleep(0.5)  # past the prelude: the module (or sleep) is running
        assert alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert wait_until(lambda: not alive(child), 1.0), "the child outlived its SIGKILLed parent"
    finally:
        parent.kill()
        try:
            os.kill(child, signal.SIGKILL)
        except (ProcessLookupError, UnboundLocalError):
            pass


def test_a_child_whose_parent_died_before_the_request_exits_without_running_anything(tmp_path):
    marker = tmp_path / "ran"
    argv = tether.python_argv("sleeper", "60")
    argv[3] = "1"  # as if its parent had died already and init had adopted it
    (tmp_path / "sleeper.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    proc = subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=30)
    assert proc.returncode == 0 and not marker.exists()
