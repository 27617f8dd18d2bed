"""Stop signals: a handler that only writes to a pipe, a watcher thread that asks for the stop, ignored ones kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from workbench.agent.signals import stop_reason

ROOT = Path(__file__).resolve().parents[1]

PROBE = """\
import os, signal, threading, time
from workbench.agent.signals import StopSignals
if "nohup" in os.sys.argv:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does before it runs the workbench
seen = []
got = threading.Event()
stops = StopSignals(lambda signum: (seen.append((signum, threading.current_thread().name)), got.set())).install()
os.kill(os.getpid(), signal.SIGHUP)
got.wait(1)
os.kill(os.getpid(), signal.SIGTERM)
got.clear()
got.wait(5)
stops.restore()
print(seen, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
"""


def probe(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_signals_reach_the_watcher_thread_and_restore_puts_the_old_handlers_back():
    assert probe() == "[(1, 'stop signals'), (15, 'stop signals')] True"


def test_a_signal_the_process_was_started_ignoring_stays_ignored():
    assert probe("nohup") == "[(15, 'stop signals')] True", "under nohup a hangup does not stop the run"


def test_stop_reasons_name_the_signal():
    assert stop_reason(15) == "stopped by signal SIGTERM"
    assert stop_reason(1) == "stopped by signal SIGHUP (the terminal hung up)"
    assert stop_reason(2) == "stopped by signal SIGINT (Ctrl-C)"
