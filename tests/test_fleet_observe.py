"""The outside look at a new best's kernels runs on the slot that checked it: on its service's GPU, only after a
passing held-out check, and before that slot takes its next job (so ncu never shares a GPU with a timed run)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from workbench.fleet.api import EvalJob, JobFinished, SlotInfo
from workbench.fleet.local import LocalPool
from workbench.fleet.observe import heldout_passed, observe
from workbench.fleet.runner import ServiceRunner

PASSED = {"verdict": "ok", "shapes": [], "heldout": [{"name": "H1", "correct": True}]}


class FakeService:
    """What ServiceRunner uses of an EvaluationService: a passing held-out check, timestamped."""

    def __init__(self, gpu: str | None, heldout_ok: bool = True) -> None:
        self.gpu = gpu
        self.task = SimpleNamespace(name="softmax")
        self.heldout_ok = heldout_ok
        self.started: dict[str, float] = {}

    def evaluate(self, path: Path, *, heldout: bool, on_stage: Any) -> dict[str, Any]:
        self.started[path.stem] = time.monotonic()
        on_stage({"stage": "forward", "shape": "S1"})
        if not heldout:
            return {"verdict": "ok", "shapes": []}
        return {"verdict": "ok", "shapes": [], "heldout": [{"name": "H1", "correct": self.heldout_ok}]}

    def health(self) -> Any:
        return SimpleNamespace(faults=[], pid=None)

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


def job(tmp_path: Path, name: str, **kw: Any) -> EvalJob:
    path = tmp_path / f"{name}.py"
    path.write_text("def forward(x):\n    return x\n")
    return EvalJob(name, 1, path, path.read_text(), **kw)


def test_observe_adds_the_look_only_to_a_passing_check_and_notes_an_observer_that_cannot_run(tmp_path):
    calls: list[tuple[str, str | None]] = []

    def observer(task: Any, path: Path, gpu: str | None) -> dict[str, Any]:
        calls.append((path.name, gpu))
        return {"observer": "ncu", "kernels": ["_k"], "problems": []}

    result: dict[str, Any] = dict(PASSED)
    observe(observer, None, tmp_path / "k.py", "2", result)  # type: ignore[arg-type]
    assert calls == [("k.py", "2")] and result["observed"]["kernels"] == ["_k"]
    for failed in ({**PASSED, "verdict": "incorrect"}, {**PASSED, "heldout": [{"name": "H1", "correct": False}]}):
        assert not heldout_passed(failed)  # type: ignore[arg-type]
        observe(observer, None, tmp_path / "k.py", "2", failed)  # type: ignore[arg-type]
        assert "observed" not in failed
    assert len(calls) == 1

    def broken(task: Any, path: Path, gpu: str | None) -> dict[str, Any]:
        raise RuntimeError("ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM)")

    result = dict(PASSED)
    observe(broken, None, tmp_path / "k.py", None, result)  # type: ignore[arg-type]
    assert "ERR_NVGPUCTRPERM" in result["observed"]["error"]


def test_the_slot_observes_on_its_services_gpu_and_takes_its_next_job_only_afterwards(tmp_path):
    service = FakeService(gpu="GPU-3f2a")
    looked: list[tuple[str, str | None, float, float]] = []

    def observer(task: Any, path: Path, gpu: str | None) -> dict[str, Any]:
        began = time.monotonic()
        time.sleep(0.4)  # ncu replays the kernels: seconds on a GPU
        looked.append((path.stem, gpu, began, time.monotonic()))
        return {"observer": "ncu", "kernels": ["_k"], "problems": []}

    info = SlotInfo("cuda:3", "cuda", gpu="3")
    runner = ServiceRunner(info, lambda: service, observer)  # type: ignore[arg-type, return-value]
    phases: list[str] = []
    runner.on_phase = phases.append
    pool = LocalPool([(info, runner)])
    try:
        pool.submit(job(tmp_path, "best", heldout=True, kind="heldout", observe=True))
        time.sleep(0.1)  # the slot holds the check; the next candidate queues behind it
        pool.submit(job(tmp_path, "next"))
        pool.submit(job(tmp_path, "unobserved", heldout=True, kind="heldout"))
        done: dict[str, Any] = {}
        deadline = time.monotonic() + 10
        while len(done) < 3 and time.monotonic() < deadline:
            done.update({e.job.id: e.result for e in pool.events(0.5) if isinstance(e, JobFinished)})
    finally:
        pool.close()
    assert [(name, gpu) for name, gpu, _began, _ended in looked] == [("best", "GPU-3f2a")], \
        "once, for the job that asked, on the GPU the slot's service uses"
    assert done["best"]["observed"]["kernels"] == ["_k"] and "observed" not in done["unobserved"]
    assert service.started["best"] < looked[0][2] < looked[0][3] <= min(service.started["next"],
                                                                       service.started["unobserved"])
    assert "observe" in phases


def test_a_failed_check_is_not_observed(tmp_path):
    seen = threading.Event()
    make = lambda: FakeService("0", heldout_ok=False)  # noqa: E731
    runner = ServiceRunner(SlotInfo("cuda:0", "cuda", gpu="0"), make,  # type: ignore[arg-type]
                           lambda task, path, gpu: seen.set() or {})
    result = runner.run(job(tmp_path, "wrong", heldout=True, kind="heldout", observe=True))
    assert not seen.is_set() and "observed" not in result
