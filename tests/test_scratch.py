"""Scratch folders name their owner, and the sweep removes those whose owner died (workbench/evaluator/scratch.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from workbench.evaluator import scratch

ROOT = Path(__file__).resolve().parents[1]


def _made_by_a_dead_process(root: Path, kind: str = "eval") -> Path:
    """A scratch folder made by a process that then died without cleaning up (as under SIGKILL)."""
    out = subprocess.run([sys.executable, "-c", f"from workbench.evaluator import scratch; "
                          f"p = scratch.make({kind!r}, {str(root)!r}); (p / 'kernel.py').write_text('x'); print(p)"],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return Path(out.stdout.strip())


def test_a_dead_owners_folder_is_swept_and_a_live_ones_is_kept(tmp_path):
    dead = _made_by_a_dead_process(tmp_path)
    live = scratch.make("service", tmp_path)
    (live / "service.log").write_text("running")
    assert dead.name.startswith("workbench-eval-") and (dead / scratch.OWNER).is_file()
    assert scratch.sweep((tmp_path,)) == 1
    assert not dead.exists()
    assert (live / "service.log").read_text() == "running"


def test_a_reused_pid_does_not_keep_a_folder(tmp_path):
    folder = scratch.make("slab", tmp_path)
    (folder / scratch.OWNER).write_text(f"{os.getpid()} 1\n")  # our pid, but another process's start time
    assert scratch.sweep((tmp_path,)) == 1
    assert not folder.exists()


def test_folders_that_name_no_owner_are_left_alone(tmp_path):
    legacy = tmp_path / "workbench-eval-legacy"
    legacy.mkdir()
    other = tmp_path / "someone-else"
    other.mkdir()
    (other / scratch.OWNER).write_text("999999 1\n")
    broken = scratch.make("template", tmp_path)
    (broken / scratch.OWNER).write_text("not a pid")
    assert scratch.sweep((tmp_path,)) == 0
    assert legacy.exists() and other.exists() and broken.exists()


def test_the_first_service_of_a_process_sweeps(tmp_path):
    """End to end: a run killed with SIGKILL left its evaluation folder; the next process's first evaluation service
    removes it."""
    dead = _made_by_a_dead_process(tmp_path)
    code = ("from workbench.evaluator import EvaluationService; from workbench.tasks import load_task; "
            "s = EvaluationService(load_task('softmax'), 'cpu', prestart=False); s.close()")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)})
    assert not dead.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("workbench-")]  # and its own are gone too
