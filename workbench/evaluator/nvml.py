"""In-process NVML reads of clocks, temperature, power and throttle reasons, so sampling never spawns nvidia-smi."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any

LIBRARY = "libnvidia-ml.so.1"
"""The versioned name the driver installs; the unversioned .so only ships with the CUDA toolkit's dev files."""

SUCCESS = 0
NOT_SUPPORTED = 3
CLOCK_SM = 1
CLOCK_MEM = 2
TEMPERATURE_GPU = 0

_Uint = ctypes.POINTER(ctypes.c_uint)
_Ulonglong = ctypes.POINTER(ctypes.c_ulonglong)
_SIGNATURES: dict[str, list[Any]] = {
    "nvmlInit_v2": [],
    "nvmlDeviceGetHandleByIndex_v2": [ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)],
    "nvmlDeviceGetHandleByUUID": [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)],
    "nvmlDeviceGetHandleByPciBusId_v2": [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)],
    "nvmlDeviceGetClockInfo": [ctypes.c_void_p, ctypes.c_int, _Uint],
    "nvmlDeviceGetTemperature": [ctypes.c_void_p, ctypes.c_int, _Uint],
    "nvmlDeviceGetPowerUsage": [ctypes.c_void_p, _Uint],
    "nvmlDeviceGetCurrentClocksEventReasons": [ctypes.c_void_p, _Ulonglong],
    "nvmlDeviceGetCurrentClocksThrottleReasons": [ctypes.c_void_p, _Ulonglong],
}
"""Declared so ctypes converts arguments exactly; without argtypes a handle would be passed as a C int."""


def _watts(milliwatts: int) -> str:
    # nvidia-smi prints watts with two decimals; the sampler parses either source with float().
    return f"{milliwatts / 1000:.2f}"


def _mask(value: int) -> str:
    # nvidia-smi's form, so envinfo.throttled() and the stored env read the same from either source.
    return f"0x{value:016x}"


_FIELDS: list[tuple[str, tuple[str, ...], tuple[int, ...], Any, Callable[[int], str]]] = [
    ("clocks.sm", ("nvmlDeviceGetClockInfo",), (CLOCK_SM,), ctypes.c_uint, str),
    ("clocks.mem", ("nvmlDeviceGetClockInfo",), (CLOCK_MEM,), ctypes.c_uint, str),
    ("temperature.gpu", ("nvmlDeviceGetTemperature",), (TEMPERATURE_GPU,), ctypes.c_uint, str),
    ("power.draw", ("nvmlDeviceGetPowerUsage",), (), ctypes.c_uint, _watts),
    # Drivers from r535 name it "clocks event reasons"; older ones only export the throttle-reasons name.
    ("throttle.active", ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), (),
     ctypes.c_ulonglong, _mask),
]
"""Row key (as envinfo.smi_query names it), NVML functions to try in order, extra arguments, out type, formatter."""


def visible_target() -> str:
    """The GPU this process uses as nvidia-smi's -i wants it: the first CUDA_VISIBLE_DEVICES entry, else "0"."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


class Reader:
    """Reads one GPU's sampled fields through an initialised NVML library.

    `lib` is anything with the NVML functions as attributes (a ctypes CDLL, or a fake in tests); each function
    takes ctypes pointers for its outputs and returns an nvmlReturn_t.
    """

    def __init__(self, lib: Any, handle: ctypes.c_void_p):
        self._handle = handle
        self._calls: list[tuple[str, Callable[..., int], tuple[int, ...], Any, Callable[[int], str]]] = []
        for key, names, args, out_type, fmt in _FIELDS:
            # A symbol this driver lacks drops its field once here instead of failing every sample.
            fn = next((f for f in (getattr(lib, name, None) for name in names) if f is not None), None)
            if fn is not None:
                self._calls.append((key, fn, args, out_type, fmt))

    def row(self) -> dict[str, str]:
        """One sample, keyed and formatted like envinfo.smi_query(); a field NVML cannot give is left out."""
        out: dict[str, str] = {}
        for key, fn, args, out_type, fmt in self._calls:
            value = out_type()
            try:
                rc = fn(self._handle, *args, ctypes.pointer(value))
            except Exception:  # noqa: BLE001 - a sampler field is optional; the timing thread must keep going
                continue
            if rc == SUCCESS:
                out[key] = fmt(value.value)
        return out


def _handle(lib: Any, target: str) -> ctypes.c_void_p | None:
    """The handle for an nvidia-smi style target: an index, a GPU-/MIG- UUID, or a PCI bus id."""
    handle = ctypes.c_void_p()
    if target.isdigit():
        rc = lib.nvmlDeviceGetHandleByIndex_v2(int(target), ctypes.pointer(handle))
    elif target.startswith(("GPU-", "MIG-")):
        rc = lib.nvmlDeviceGetHandleByUUID(target.encode(), ctypes.pointer(handle))
    elif ":" in target:
        rc = lib.nvmlDeviceGetHandleByPciBusId_v2(target.encode(), ctypes.pointer(handle))
    else:
        return None
    return handle if rc == SUCCESS else None


def open_reader(lib: Any, target: str) -> Reader | None:
    """Initialise NVML in `lib` and bind the target GPU; None when any step fails (never raises)."""
    try:
        if lib.nvmlInit_v2() != SUCCESS:
            return None
        handle = _handle(lib, target)
    except Exception:  # noqa: BLE001 - missing symbols, bad arguments: NVML is then simply unusable here
        return None
    return Reader(lib, handle) if handle is not None else None


def load_library(name: str | None = None) -> Any | None:
    """dlopen the NVML library (default LIBRARY) with its signatures declared; None when it is not installed."""
    try:
        lib = ctypes.CDLL(name or LIBRARY)
    except OSError:
        return None
    for symbol, argtypes in _SIGNATURES.items():
        fn = getattr(lib, symbol, None)
        if fn is not None:
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
    return lib


_lock = threading.Lock()
_readers: dict[str, Reader | None] = {}
"""Per target, the opened reader or None for "NVML unusable": a failure is cached so it is paid once."""


def reader(target: str | None = None) -> Reader | None:
    """The process-wide reader for `target` (default: visible_target()), opening NVML on first use."""
    target = visible_target() if target is None else target
    with _lock:
        if target not in _readers:
            lib = load_library()
            _readers[target] = open_reader(lib, target) if lib is not None else None
        return _readers[target]


def query(target: str | None = None) -> dict[str, str] | None:
    """One NVML row for the GPU this process uses: None when NVML is unusable, {} when it gave no field."""
    found = reader(target)
    return found.row() if found is not None else None


def reset() -> None:
    """Forget the cached readers, so the next query opens NVML again (tests, or after CUDA_VISIBLE_DEVICES moves)."""
    with _lock:
        _readers.clear()
