"""A baseline's autotuning choices recorded and replayed (workbench/evaluator/tuned.py), on Triton's interpreter.

The kernels come from a fixture module; the autotuners' benchmark is replaced by a counting stand-in, so a test can
tell whether autotuning ran. On the H200 the same path is measured end to end (RESULTS, "fresh machine").
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import pytest

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

from workbench.evaluator import tuned  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "tuned"
MODULE = "autotuned_kernels"


class CountingBench:
    """The autotuner's do_bench: config BLOCK=32 (or 64) is 'fastest'; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, kernel_call, quantiles=None, **_):  # noqa: ANN001 - Triton's benchmarker signature
        self.calls += 1
        kernel_call()
        return [1.0, 1.0, 1.0]


@pytest.fixture
def kernels(monkeypatch):
    """A fresh import of the fixture module (empty autotuner caches), with counting benchmarks."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    sys.modules.pop(MODULE, None)
    module = importlib.import_module(MODULE)
    benches = {}
    for name, tuner in tuned.autotuners([MODULE]):
        benches[name] = CountingBench()
        tuner.do_bench = benches[name]
    yield module, benches
    sys.modules.pop(MODULE, None)


def _call(module, name: str, n: int) -> torch.Tensor:
    x = torch.arange(n, dtype=torch.float32)
    y = torch.empty_like(x)
    getattr(module, name)[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, y, n)
    return y


def test_autotuners_are_found_under_heuristics(kernels):
    names = [name for name, _ in tuned.autotuners([MODULE])]
    assert names == [f"{MODULE}.double", f"{MODULE}.triple"]


def test_record_then_replay_skips_autotuning_and_picks_the_same_config(kernels, tmp_path):
    module, benches = kernels
    for n in (100, 7):
        _call(module, "double", n)
    _call(module, "triple", 50)
    assert benches[f"{MODULE}.double"].calls == 4  # two configs, two keys: autotuning ran
    chosen = {name: dict(t.cache) for name, t in tuned.autotuners([MODULE])}
    table = tuned.record("Test GPU", [MODULE])
    assert set(table["choices"]) == {f"{MODULE}.double", f"{MODULE}.triple"}
    path = tuned.path_for(tmp_path, "Test GPU")
    assert path.name == "test-gpu.json"
    tuned.write(path, table)

    sys.modules.pop(MODULE, None)  # a new trusted process: fresh autotuners, empty caches
    module = importlib.import_module(MODULE)
    fresh = {}
    for name, tuner in tuned.autotuners([MODULE]):
        fresh[name] = tuner.do_bench = CountingBench()
    replay = tuned.replay(tmp_path, "Test GPU", [MODULE])
    assert replay == {"file": str(path), "applied": 3, "skipped": ""}
    y = _call(module, "double", 100)
    _call(module, "double", 7)
    _call(module, "triple", 50)
    assert torch.equal(y, torch.arange(100, dtype=torch.float32) * 2)
    assert [b.calls for b in fresh.values()] == [0, 0]
    for name, tuner in tuned.autotuners([MODULE]):
        assert {k: (c.kwargs, c.num_warps) for k, c in tuner.cache.items()} == \
            {k: (c.kwargs, c.num_warps) for k, c in chosen[name].items()}
        assert all(any(c is offered for offered in tuner.configs) for c in tuner.cache.values())
    _call(module, "double", 33)  # a key the file does not have autotunes as before
    assert fresh[f"{MODULE}.double"].calls == 2


def _table(tmp_path, **changes) -> Path:
    table = {"version": tuned.VERSION, "gpu": "Test GPU", "triton": triton.__version__, "libraries": {},
             "choices": {f"{MODULE}.double": {repr((100, "torch.float32", "torch.float32")): {
                 "kwargs": {"BLOCK": 32}, "num_warps": 2, "num_stages": 3, "num_ctas": 1, "maxnreg": None}}}}
    table.update(changes)
    path = tuned.path_for(tmp_path, "Test GPU")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table))
    return path


@pytest.mark.parametrize("changes, why", [
    ({"gpu": "Other GPU"}, "recorded on Other GPU"),
    ({"triton": "0.0.1"}, "recorded with Triton 0.0.1"),
    ({"libraries": {"torch": "0.0.1"}}, "recorded with torch 0.0.1"),
    ({"version": 99}, "not a version-1 choices file"),
])
def test_a_file_from_elsewhere_is_not_replayed(kernels, tmp_path, changes, why):
    _table(tmp_path, **changes)
    replay = tuned.replay(tmp_path, "Test GPU", [MODULE])
    assert replay["applied"] == 0 and why in replay["skipped"]


def test_a_config_the_autotuner_does_not_offer_is_not_used(kernels, tmp_path):
    module, benches = kernels
    _table(tmp_path, choices={f"{MODULE}.double": {repr((100, "torch.float32", "torch.float32")): {
        "kwargs": {"BLOCK": 128}, "num_warps": 2, "num_stages": 3, "num_ctas": 1, "maxnreg": None}}})
    assert tuned.replay(tmp_path, "Test GPU", [MODULE])["applied"] == 0
    _call(module, "double", 100)
    assert benches[f"{MODULE}.double"].calls == 2


def test_missing_and_broken_files_say_why(kernels, tmp_path):
    assert "no test-gpu.json" in tuned.replay(tmp_path, "Test GPU", [MODULE])["skipped"]
    path = tuned.path_for(tmp_path, "Test GPU")
    path.parent.mkdir()
    path.write_text("{ not json")
    assert "cannot be read" in tuned.replay(tmp_path, "Test GPU", [MODULE])["skipped"]


def test_save_choices_needs_a_gpu(capsys):
    from workbench import cli

    assert cli.main(["task", "check", "softmax", "--device", "cpu", "--save-choices"]) != 0
    assert "--save-choices records a GPU's autotuning choices" in capsys.readouterr().err


SHIPPED = sorted((Path(__file__).parents[1] / "kernels").glob(f"*/{tuned.FOLDER}/*.json"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parents[1].name}/{p.name}")
def test_shipped_choices_load_for_the_gpu_they_are_named_for(path):
    """A committed file is replayed only if its name is the slug of the GPU inside it and it loads with the pinned
    Triton: a misnamed or hand-edited file would be skipped on every machine without a word in the suite."""
    table = json.loads(path.read_text(encoding="utf-8"))
    assert tuned.path_for(path.parents[1], table["gpu"]) == path
    loaded, why = tuned.load(path, table["gpu"])
    assert loaded is not None, why
    assert loaded["choices"] and all(loaded["choices"].values())


def test_kda_ships_choices_for_both_hopper_cards():
    names = {p.name for p in SHIPPED if p.parents[1].name == "kda"}
    assert {"nvidia-h200.json", "nvidia-h100-80gb-hbm3.json"} <= names
