"""GPU discovery, busy GPUs, CPU shares and the pool factory's one-line errors, from canned nvidia-smi output."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.fleet import factory, gpus
from workbench.fleet.api import FleetError

SMI_GPUS = """\
0, GPU-aaaa-0000, NVIDIA H200, 1
1, GPU-bbbb-1111, NVIDIA H200, 70213
2, GPU-cccc-2222, NVIDIA H200, 3
3, GPU-dddd-3333, NVIDIA H200, 4500
"""
SMI_APPS = """\
GPU-bbbb-1111, 4242, 70200
GPU-dddd-3333, 777, 4490
"""


def smi(gpu_text: str = SMI_GPUS, app_text: str = SMI_APPS):
    def run(args):
        return gpu_text if args[0].startswith("--query-gpu") else app_text
    return run


def test_busy_gpus_are_those_held_by_processes_not_ours_or_by_unlisted_memory():
    found = gpus.discover(smi(), env={}, ours={777})
    assert [(g.index, g.uuid, g.name) for g in found][:1] == [("0", "GPU-aaaa-0000", "NVIDIA H200")]
    busy = {g.index: g.busy for g in found}
    assert busy["0"] == "" and busy["2"] == ""
    assert "pid 4242 (70200 MiB)" in busy["1"]
    assert busy["3"] == ""  # pid 777 is ours: its memory is accounted for
    found = gpus.discover(smi(app_text=""), env={}, ours=set())
    assert "70213 MiB of its memory" in {g.index: g.busy for g in found}["1"]  # processes a container cannot list


def test_cuda_visible_devices_picks_and_orders_the_gpus():
    found = gpus.discover(smi(), env={"CUDA_VISIBLE_DEVICES": "2,GPU-aaaa"}, ours=set())
    assert [g.index for g in found] == ["2", "0"]
    assert gpus.discover(smi(), env={"CUDA_VISIBLE_DEVICES": ""}, ours=set()) == []
    assert [g.index for g in gpus.discover(smi(), env={"CUDA_VISIBLE_DEVICES": "0,9,2"}, ours=set())] == ["0"]


def test_names_with_commas_and_missing_figures_parse():
    rows = gpus.parse_gpus("0, GPU-x, NVIDIA H100 80GB HBM3, [N/A]\n")
    assert rows == [("0", "GPU-x", "NVIDIA H100 80GB HBM3", 0)]
    assert gpus.parse_apps("No running processes found\n") == []


def test_own_pids_follow_the_process_tree(tmp_path: Path):
    for pid, ppid, comm in ((10, 1, "init"), (11, 10, "a) b"), (12, 11, "c"), (13, 1, "other")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} 0 0\n")
    assert gpus.own_pids(10, proc=tmp_path) == {10, 11, 12}


def test_cpu_plans_give_each_slot_its_own_cpus():
    plan = gpus.plan_cpus(2, range(16), "cuda")
    assert plan.slots == [[0, 1], [2, 3]] and plan.spare == list(range(4, 16))
    plan = gpus.plan_cpus(8, range(12), "cuda")  # not enough for pairs and a spare: one each
    assert plan.slots == [[i] for i in range(8)] and plan.spare == [8, 9, 10, 11]
    assert gpus.plan_cpus(4, [0, 1], "cuda").spare is None
    assert gpus.plan_cpus(2, [0, 1], "cpu").slots == [[0], [1]]
    assert gpus.plan_cpus(1, [0, 1], "cpu").slots == [[0, 1]]
    assert gpus.plan_cpus(3, [0, 1, 2, 3, 4, 5], "cpu").slots == [[0, 1], [2, 3], [4, 5]]


def test_the_factory_refuses_more_workers_than_free_gpus_in_one_line(monkeypatch):
    monkeypatch.setattr(gpus, "_smi", smi())
    monkeypatch.setattr(gpus, "own_pids", lambda: set())
    task = object()
    with pytest.raises(FleetError) as err:
        factory.make_pool(task, "cuda", workers=3)  # type: ignore[arg-type]
    assert str(err.value) == "--workers 3: this host has 2 free GPUs (4 visible; 2 busy with another job)"
    with pytest.raises(FleetError) as early:  # what the CLI checks before it makes a session
        factory.preflight("cuda", workers=3)
    assert str(early.value) == str(err.value)
    factory.preflight("cuda", workers=2)
    monkeypatch.setattr(gpus, "_smi", smi(SMI_GPUS.replace(", 1\n", ", 9000\n").replace(", 3\n", ", 9000\n")))
    with pytest.raises(FleetError, match="every visible GPU is busy with another job"):
        factory.make_pool(task, "cuda")  # type: ignore[arg-type]
    with pytest.raises(FleetError, match="--workers must be a positive number"):
        factory.make_pool(task, "cpu", workers=0)  # type: ignore[arg-type]
    with pytest.raises(FleetError, match="one per worker at most"):
        factory.make_pool(task, "cpu", workers=999)  # type: ignore[arg-type]
    with pytest.raises(FleetError, match="one per worker at most"):
        factory.preflight("cpu", workers=999)
    with pytest.raises(FleetError, match="unknown cluster"):
        factory.make_pool(task, "cpu", cluster="slurm")  # type: ignore[arg-type]
