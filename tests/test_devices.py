"""workbench.devices: the device a run picks, and the roofline peaks per GPU model."""

from __future__ import annotations

import pytest

from workbench import devices
from workbench.devices import PEAKS, UNKNOWN_PEAKS, DeviceError, peaks_for, resolve_device
from workbench.tasks import load_task


def test_auto_device(monkeypatch):
    monkeypatch.setattr(devices.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert resolve_device("auto") == "cuda"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert resolve_device("auto") == "cpu" and devices.gpu_name() is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert resolve_device("auto") == "cuda"
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    assert resolve_device("auto") == "cpu" and devices.gpu_name() is None
    assert resolve_device("cuda") == "cuda"
    with pytest.raises(DeviceError, match="unknown device 'tpu'"):
        resolve_device("tpu")


@pytest.mark.parametrize("name, model, tb_s", [
    ("NVIDIA H200", "H200", 4.8), ("NVIDIA H200 NVL", "H200 NVL", 4.8), ("NVIDIA H100 80GB HBM3", "H100 SXM", 3.35),
    ("NVIDIA H100 PCIe", "H100 PCIe", 2.0), ("NVIDIA H100 NVL", "H100 NVL", 3.9), ("NVIDIA GH200 480GB", "GH200", 4.9),
    ("NVIDIA A100-SXM4-80GB", "A100", 2.039), ("NVIDIA B200", "B200", 8.0), ("NVIDIA H20", "H20", 4.0),
])
def test_peaks_by_device_name(name, model, tb_s):
    peaks = peaks_for(name)
    assert peaks.gpu == model and peaks.known
    assert peaks.bytes_per_s == pytest.approx(tb_s * 1e12)
    assert peaks.real_bytes_per_s < peaks.bytes_per_s and peaks.real_flops_per_s < peaks.flops_per_s


def test_h200_realistic_figures_are_ours():
    h200 = peaks_for("NVIDIA H200")
    assert h200.measured
    assert (h200.real_bytes_per_s, h200.real_flops_per_s) == (4.25e12, 672e12)
    assert (h200.bytes_per_s, h200.flops_per_s) == (4.8e12, 989e12)
    assert not peaks_for("NVIDIA H100 PCIe").measured


def test_an_unknown_gpu_gets_a_floor_that_can_never_be_too_high():
    unknown = peaks_for("Some Future Accelerator")
    assert unknown is UNKNOWN_PEAKS and not unknown.known and peaks_for(None) is UNKNOWN_PEAKS
    assert unknown.bytes_per_s == max(p.bytes_per_s for _, p in PEAKS)
    assert unknown.flops_per_s == max(p.flops_per_s for _, p in PEAKS)
    task = load_task("kda")
    for shape in task.shapes["cuda"]:
        floor = task.floor_ms(shape, "cuda", "Some Future Accelerator")
        assert all(floor <= task.floor_ms(shape, "cuda", p.gpu) for _, p in PEAKS)


def test_floors_follow_the_gpu():
    task = load_task("softmax")
    h200, pcie = task.floor_ms("S1", "cuda", "NVIDIA H200"), task.floor_ms("S1", "cuda", "NVIDIA H100 PCIe")
    flops, nbytes = task.work("S1")
    assert h200 == pytest.approx(nbytes / 4.8e12 * 1e3) and pcie == pytest.approx(nbytes / 2.0e12 * 1e3)
    assert task.floor_ms("S1", "cpu", "NVIDIA H200") is None
    view = task.public_view("NVIDIA H100 PCIe")
    assert view["shapes"]["cuda"][0]["floor_ms"] == pytest.approx(pcie)
