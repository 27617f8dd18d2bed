"""Budget stops the long-horizon agent relies on: plateau and the roofline fraction, and their CLI flags."""

import subprocess
import sys
from pathlib import Path

from workbench.agent.budget import Budget, attempts_since_best, roofline_fraction
from workbench.session.state import Attempt, SessionState

ROOT = Path(__file__).resolve().parents[1]


def evaluated(state, n, speedup, verdict="ok", shapes=None, comparable=True):
    state.attempts[n] = Attempt(n=n, sha256=str(n), author="agent", verdict=verdict, speedup=speedup,
                                timing_comparable=comparable, shapes=shapes or [])
    best = state.best_attempt
    if verdict == "ok" and (best is None or speedup > best.speedup):
        state.best = n


def test_plateau_counts_evaluated_attempts_since_the_best():
    state = SessionState()
    budget = Budget(plateau=3)
    evaluated(state, 1, 1.0)
    evaluated(state, 2, 1.4)
    evaluated(state, 3, 1.1)
    evaluated(state, 4, None, verdict="incorrect")
    assert attempts_since_best(state) == 2 and budget.exceeded(state) is None
    state.attempts[5] = Attempt(n=5, sha256="5", author="agent")  # written, not evaluated: does not count
    assert budget.exceeded(state) is None
    evaluated(state, 6, 1.2)
    assert budget.exceeded(state) == "plateau: no improvement in 3 attempts"
    evaluated(state, 7, 1.5)
    assert budget.exceeded(state) is None
    empty = SessionState()
    for n in range(1, 4):
        evaluated(empty, n, None, verdict="compile_error")
    assert "no improvement in 3" in Budget(plateau=3).exceeded(empty)


def test_roofline_stop_needs_comparable_timings_with_floors():
    shapes = [{"name": "S1", "ms": 1.0, "floor_ms": 0.5}, {"name": "S2", "ms": 1.0, "floor_ms": 1.0}]
    state = SessionState()
    evaluated(state, 1, 2.0, shapes=shapes)
    assert roofline_fraction(state.best_attempt) == 0.75
    assert Budget(roofline_fraction=0.75).exceeded(state) == "roofline: best reaches 75% of the roofline (target 75%)"
    assert Budget(roofline_fraction=0.9).exceeded(state) is None
    interp = SessionState()
    evaluated(interp, 1, 2.0, shapes=shapes, comparable=False)
    assert Budget(roofline_fraction=0.1).exceeded(interp) is None  # interpreter timings mean nothing
    no_floor = SessionState()
    evaluated(no_floor, 1, 2.0, shapes=[{"name": "S1", "ms": 0.2, "floor_ms": None}])
    assert roofline_fraction(no_floor.best_attempt) is None


def test_budget_round_trips_and_the_cli_checks_the_new_flags(tmp_path):
    budget = Budget(max_tool_calls=5, plateau=4, roofline_fraction=0.7, context_tokens=50_000)
    assert Budget.from_dict(budget.to_dict()) == budget
    for flags, message in ((["--plateau", "0"], "--plateau must be at least 1"),
                           (["--roofline-fraction", "1.5"], "--roofline-fraction must be in (0, 1]"),
                           (["--context-budget", "100"], "--context-budget must be at least 4000")):
        proc = subprocess.run([sys.executable, "-m", "workbench", "run", "softmax", "--agent", "tuner", "--headless",
                               "--sessions-dir", str(tmp_path), *flags], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1
