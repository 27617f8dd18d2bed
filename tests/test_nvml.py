"""The in-process NVML reader and the clock sampler's choice of source, against a fake library (no GPU needed)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from workbench.evaluator import envinfo, nvml

HANDLE = 0x5150


def fake_library(*, sm=1980, mem=3201, temp=57, milliwatts=412340, reasons=0x4, init_rc=0, unsupported=(),
                 missing=(), raises=()):
    """An object shaped like the ctypes CDLL: NVML functions as attributes, outputs written through pointers.

    `unsupported` names row keys answered with NOT_SUPPORTED, `missing` drops symbols, `raises` names row keys whose
    function raises. `calls` records what the binding asked for, so tests can check the handle and target it used.
    """
    calls: list[tuple] = []

    def answer(key, out, value):
        if key in raises:
            raise OSError(f"fake NVML fault reading {key}")
        if key in unsupported:
            return nvml.NOT_SUPPORTED
        out.contents.value = value
        return nvml.SUCCESS

    def own(handle):
        assert handle.value == HANDLE, "a field was read through a handle the library never gave out"

    def by_index(index, out):
        calls.append(("index", index))
        out.contents.value = HANDLE
        return nvml.SUCCESS

    def by_uuid(uuid, out):
        calls.append(("uuid", uuid))
        out.contents.value = HANDLE
        return nvml.SUCCESS

    def by_pci(bus_id, out):
        calls.append(("pci", bus_id))
        out.contents.value = HANDLE
        return nvml.SUCCESS

    def init():
        calls.append(("init",))
        return init_rc

    def clock(handle, kind, out):
        own(handle)
        key = {nvml.CLOCK_SM: "clocks.sm", nvml.CLOCK_MEM: "clocks.mem"}[kind]
        return answer(key, out, sm if kind == nvml.CLOCK_SM else mem)

    def temperature(handle, sensor, out):
        own(handle)
        assert sensor == nvml.TEMPERATURE_GPU
        return answer("temperature.gpu", out, temp)

    def power(handle, out):
        own(handle)
        return answer("power.draw", out, milliwatts)

    def event_reasons(handle, out):
        own(handle)
        calls.append(("event_reasons",))
        return answer("throttle.active", out, reasons)

    def throttle_reasons(handle, out):
        own(handle)
        calls.append(("throttle_reasons",))
        return answer("throttle.active", out, reasons)

    functions = {
        "nvmlInit_v2": init,
        "nvmlDeviceGetHandleByIndex_v2": by_index,
        "nvmlDeviceGetHandleByUUID": by_uuid,
        "nvmlDeviceGetHandleByPciBusId_v2": by_pci,
        "nvmlDeviceGetClockInfo": clock,
        "nvmlDeviceGetTemperature": temperature,
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetCurrentClocksEventReasons": event_reasons,
        "nvmlDeviceGetCurrentClocksThrottleReasons": throttle_reasons,
    }
    lib = SimpleNamespace(**{name: fn for name, fn in functions.items() if name not in missing})
    lib.calls = calls
    return lib


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    """Each test opens NVML itself: the process-wide reader cache must not leak between tests."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml.reset()
    yield
    nvml.reset()


def use_library(monkeypatch, lib):
    """Make the lazy loader hand out `lib`, counting how often it is asked (it should be once per target)."""
    loads = []

    def load(name=None):
        loads.append(name)
        return lib

    monkeypatch.setattr(nvml, "load_library", load)
    return loads


def sample(sampler: envinfo.ClockSampler, count: int) -> dict:
    sampler.start()
    deadline = time.monotonic() + 10
    while len(sampler.samples) < count and time.monotonic() < deadline:
        time.sleep(0.001)
    return sampler.stop()


def test_row_has_smi_keys_and_forms():
    reader = nvml.open_reader(fake_library(), "0")
    row = reader.row()
    assert row == {
        "clocks.sm": "1980",
        "clocks.mem": "3201",
        "temperature.gpu": "57",
        "power.draw": "412.34",
        "throttle.active": "0x0000000000000004",
    }
    assert envinfo.throttled(row) == "0x4"
    assert envinfo.throttled(nvml.open_reader(fake_library(reasons=0x1), "0").row()) is None


def test_not_supported_field_is_left_out():
    row = nvml.open_reader(fake_library(unsupported={"power.draw", "clocks.mem"}), "0").row()
    assert set(row) == {"clocks.sm", "temperature.gpu", "throttle.active"}


def test_older_driver_falls_back_to_throttle_reasons_symbol():
    lib = fake_library(missing={"nvmlDeviceGetCurrentClocksEventReasons"}, reasons=0x24)
    row = nvml.open_reader(lib, "0").row()
    assert row["throttle.active"] == "0x0000000000000024" and ("throttle_reasons",) in lib.calls
    both_gone = fake_library(missing={"nvmlDeviceGetCurrentClocksEventReasons",
                                      "nvmlDeviceGetCurrentClocksThrottleReasons"})
    assert "throttle.active" not in nvml.open_reader(both_gone, "0").row()


def test_a_raising_field_is_left_out_not_raised():
    row = nvml.open_reader(fake_library(raises={"temperature.gpu"}), "0").row()
    assert "temperature.gpu" not in row and row["clocks.sm"] == "1980"


@pytest.mark.parametrize("lib", [
    fake_library(init_rc=9),  # NVML_ERROR_DRIVER_NOT_LOADED
    fake_library(missing={"nvmlInit_v2"}),
    fake_library(missing={"nvmlDeviceGetHandleByIndex_v2"}),
])
def test_unusable_library_gives_no_reader(lib):
    assert nvml.open_reader(lib, "0") is None


def test_handle_lookup_follows_cuda_visible_devices(monkeypatch):
    cases = {
        "2,3": ("index", 2),
        "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6": ("uuid", b"GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"),
        "00000000:3B:00.0": ("pci", b"00000000:3B:00.0"),
        "": ("index", 0),
    }
    for visible, expected in cases.items():
        nvml.reset()
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        lib = fake_library()
        use_library(monkeypatch, lib)
        assert nvml.query() is not None
        assert expected in lib.calls, visible


def test_init_once_and_failure_cached(monkeypatch):
    lib = fake_library()
    loads = use_library(monkeypatch, lib)
    for _ in range(3):
        assert nvml.query()["clocks.sm"] == "1980"
    assert lib.calls.count(("init",)) == 1 and len(loads) == 1
    nvml.reset()
    loads = use_library(monkeypatch, None)
    assert nvml.query() is None and nvml.query() is None
    assert len(loads) == 1


def test_real_loader_without_library_returns_none(monkeypatch):
    monkeypatch.setattr(nvml, "LIBRARY", "libnvidia-ml-absent-for-this-test.so.1")
    assert nvml.load_library() is None
    assert nvml.query() is None


def test_sampler_uses_nvml_when_it_answers(monkeypatch):
    use_library(monkeypatch, fake_library())

    def no_smi():
        raise AssertionError("nvidia-smi spawned although NVML answers")

    monkeypatch.setattr(envinfo, "smi_query", no_smi)
    # The nvidia-smi interval is never used once NVML answers: 3 samples arrive long before 60 s.
    summary = sample(envinfo.ClockSampler(interval_s=60, nvml_interval_s=0.001), 3)
    assert summary["source"] == "nvml" and summary["samples"] >= 3 and "errors" not in summary
    assert summary["sm_mhz"] == [1980.0, 1980.0] and summary["power_w_max"] == pytest.approx(412.34)
    assert envinfo.throttled(summary) == "0x4"


def test_sampler_without_library_falls_back_to_nvidia_smi(monkeypatch):
    monkeypatch.setattr(nvml, "LIBRARY", "libnvidia-ml-absent-for-this-test.so.1")
    rows = iter([{"clocks.sm": "1755", "clocks.mem": "3201", "temperature.gpu": "50", "power.draw": "300.00",
                  "throttle.active": "0x0000000000000001"}] * 2)
    monkeypatch.setattr(envinfo, "smi_query", lambda: next(rows, {}))
    summary = sample(envinfo.ClockSampler(interval_s=0.001, nvml_interval_s=60), 2)
    assert summary["source"] == "nvidia-smi" and summary["samples"] == 2 and summary["sm_mhz"] == [1755.0, 1755.0]


def test_sampler_falls_back_when_nvml_gives_no_field(monkeypatch):
    everything = {"clocks.sm", "clocks.mem", "temperature.gpu", "power.draw", "throttle.active"}
    use_library(monkeypatch, fake_library(unsupported=everything))
    monkeypatch.setattr(envinfo, "smi_query", lambda: {"clocks.sm": "1500"})
    summary = sample(envinfo.ClockSampler(interval_s=0.001), 2)
    assert summary["source"] == "nvidia-smi" and summary["sm_mhz"] == [1500.0, 1500.0]


def test_nvml_raising_mid_sampling_keeps_the_thread_alive(monkeypatch):
    answers = iter([{"clocks.sm": "1980"}, RuntimeError("driver went away"), {"clocks.sm": "1410"}])

    def flaky(target=None):
        answer = next(answers, {"clocks.sm": "1700"})
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(nvml, "query", flaky)
    monkeypatch.setattr(envinfo, "smi_query", lambda: pytest.fail("switched source mid-run"))
    sampler = envinfo.ClockSampler(interval_s=0.001, nvml_interval_s=0.001)
    sampler.start()
    deadline = time.monotonic() + 10
    while len(sampler.samples) < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert sampler.is_alive()
    summary = sampler.stop()
    assert summary["source"] == "nvml" and summary["errors"] == 1 and summary["samples"] >= 4
    assert summary["sm_mhz"] == [1410.0, 1980.0]


def test_real_signatures_cover_every_symbol_the_binding_calls():
    """A symbol called without declared argtypes would get its handle passed as a C int: keep the table complete."""
    called = {name for _, names, _, _, _ in nvml._FIELDS for name in names}
    called |= {"nvmlInit_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID",
               "nvmlDeviceGetHandleByPciBusId_v2"}
    assert called <= set(nvml._SIGNATURES)


SHIM = r"""
typedef void *nvmlDevice_t;
static int device;
static int same(const char *a, const char *b) { while (*a && *a == *b) { a++; b++; } return *a == *b; }
int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { if (i != 1) return 2; *d = &device; return 0; }
int nvmlDeviceGetHandleByUUID(const char *u, nvmlDevice_t *d) {
    if (!same(u, "GPU-shim")) return 6;
    *d = &device;
    return 0;
}
int nvmlDeviceGetClockInfo(nvmlDevice_t d, int t, unsigned int *v) {
    if (d != &device) return 2;
    if (t == 1) { *v = 1980; return 0; }
    if (t == 2) { *v = 3201; return 0; }
    return 2;
}
int nvmlDeviceGetTemperature(nvmlDevice_t d, int s, unsigned int *v) {
    if (d != &device || s != 0) return 2;
    *v = 41;
    return 0;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *v) { return 3; }
int nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *v) {
    if (d != &device) return 2;
    *v = 0x8000000000000001ULL;
    return 0;
}
"""


@pytest.mark.parametrize("visible", ["1", "GPU-shim"])
def test_real_ctypes_marshalling_through_a_compiled_shim(tmp_path, monkeypatch, visible):
    """A C stand-in for libnvidia-ml: catches argtypes mistakes (a truncated handle, a 32-bit mask) a Python fake
    cannot. It has no clock-event-reasons symbol and no power reading, like an old driver on a board without one."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the NVML shim")
    (tmp_path / "shim.c").write_text(SHIM)
    lib = tmp_path / "libnvidia-ml-shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "shim.c")], check=True)
    monkeypatch.setattr(nvml, "LIBRARY", str(lib))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert nvml.query() == {"clocks.sm": "1980", "clocks.mem": "3201", "temperature.gpu": "41",
                            "throttle.active": "0x8000000000000001"}
    nvml.reset()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # the shim knows no GPU 0
    assert nvml.query() is None
