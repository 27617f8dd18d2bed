"""The evaluation service on a GPU: what only CUDA shows (compile reports, a GPU fault, a GPU hang, the timing's
precision). Skipped where there is no GPU; run on the H200 with the evaluator's device runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workbench.devices import gpu_name
from workbench.evaluator import EvaluationService
from workbench.evaluator.selftest import CASES_DIR
from workbench.evaluator.stats import StopRule
from workbench.tasks import load_task

pytestmark = pytest.mark.skipif(gpu_name() is None, reason="needs an NVIDIA GPU")

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "kernels" / "softmax" / "seed.py"
CASES = CASES_DIR / "softmax"


@pytest.fixture(scope="module")
def service():
    with EvaluationService(load_task("softmax"), "cuda", prepare_heldout=False) as svc:
        yield svc


def test_a_candidate_is_timed_to_the_stated_precision_and_its_compiles_are_reported(service):
    result = service.evaluate(CASES / "good_simple.py")
    assert result["verdict"] == "ok", result["message"]
    assert result["compiles"] and all(c["s"] > 0 for c in result["compiles"]), "Triton's JIT hooks reported"
    lo, hi = result["speedup_ci"]
    assert lo <= result["speedup"] <= hi
    for shape in result["shapes"]:
        assert shape["precision"] <= result["timing"]["precision_target"] or shape["reps"] >= 600
        # at least the stopping rule's blocks per side, and one spot check of the outputs in every candidate block
        assert shape["blocks"] >= StopRule.min_blocks and shape["spot_checks"] == shape["blocks"]
    assert result["isolation"]["netns"] is True or os.environ.get("WORKBENCH_NO_NETNS")
    assert result["env"]["gpu"] and result["shapes"][0]["floor_ms"] > 0


def test_a_gpu_fault_in_a_candidate_leaves_the_next_evaluation_unaffected(service):
    crash = service.evaluate(CASES / "segfault.py")
    assert crash["verdict"] == "crash" and "CUDA" in crash["message"], crash["message"]
    after = service.evaluate(SEED)
    assert after["verdict"] == "ok", after["message"]
    health = service.health()
    assert health.alive and all(f.kind != "died" for f in health.faults)


def test_hangs_are_found_in_seconds(service):
    for name in ("infinite_loop.py", "gpu_spin.py"):
        result = service.evaluate(CASES / name)
        assert result["verdict"] == "timeout", result["message"]
        assert result["elapsed_s"] < 15, (name, result["elapsed_s"], result["message"])
    assert service.evaluate(SEED)["verdict"] == "ok", "the GPU is usable again after a spinning kernel"
