"""What a timing ran on: GPU name, UUID, driver, clocks and throttle state, and the software versions."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import threading
from typing import Any

from workbench.evaluator import nvml

_SMI_FIELDS = [
    "name",
    "uuid",
    "driver_version",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "temperature.gpu",
    "power.draw",
    "pstate",
]
_THROTTLE_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
"""Newer drivers renamed throttle reasons to clock event reasons; one of the two names works."""

IDLE_REASON = 0x1
"""The "GPU idle" bit: harmless, every other active reason means the clocks were held down."""


def smi_query() -> dict[str, Any]:
    """One nvidia-smi query of the GPU this process uses; {} when nvidia-smi is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    for extra in [[name] for name in _THROTTLE_FIELDS] + [[]]:
        fields = _SMI_FIELDS + extra
        try:
            proc = subprocess.run(
                [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", nvml.visible_target()],
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if proc.returncode == 0 and proc.stdout.strip():
            values = [v.strip() for v in proc.stdout.strip().splitlines()[0].split(",")]
            keys = ["throttle.active" if f in _THROTTLE_FIELDS else f for f in fields]
            return dict(zip(keys, values))
    return {}


def quick_clocks() -> dict[str, Any]:
    """Clocks, temperature, power and throttle reasons now: NVML in-process (about 30 us), else nvidia-smi."""
    try:
        row = nvml.query()
    except Exception:  # noqa: BLE001 - NVML is optional; nvidia-smi still answers
        row = None
    return row or smi_query()


def throttled(row: dict[str, Any]) -> str | None:
    """The active throttle reasons other than idle, as hex, or None when the clocks were free."""
    raw = row.get("throttle.active")
    try:
        mask = int(str(raw), 16)
    except (TypeError, ValueError):
        return None
    return hex(mask) if mask & ~IDLE_REASON else None


def collect(device: str) -> dict[str, Any]:
    """Versions and device facts for the result's "env" (imports torch; trusted process only)."""
    from importlib import metadata

    import torch

    def version(dist: str) -> str | None:
        # Read from the installed metadata: importing triton here would cost the harness a second of start-up.
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": version("triton"),
        "numpy": version("numpy"),
        "host": platform.node(),
        "device": device,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu=torch.cuda.get_device_name(0),
            capability=f"{props.major}.{props.minor}",
            sms=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
        )
        smi = smi_query()
        if smi:
            env.update(driver=smi.get("driver_version"), uuid=smi.get("uuid"))
            env["clocks_before"] = smi
    else:
        env["interpreter"] = os.environ.get("TRITON_INTERPRET") == "1"
    return env


class ClockSampler(threading.Thread):
    """Samples clocks, temperature, power and throttle reasons while timing runs (idle clocks say nothing).

    It runs in the trusted harness, whose CPU is not the candidate worker's, and sleeps between samples. It reads
    NVML in-process when that works, because an nvidia-smi per sample costs a process start and takes the driver
    lock while kernels are being timed; otherwise it falls back to nvidia-smi. The first read picks the source
    for the whole run, so one summary never mixes the two. An NVML read costs about 30 us (an nvidia-smi about
    30 ms, on the H200), so NVML samples five times as often: a brief throttle inside a short timing is seen.
    """

    def __init__(self, interval_s: float = 1.0, nvml_interval_s: float = 0.2):
        super().__init__(name="clock-sampler", daemon=True)
        self.interval_s = interval_s
        self.nvml_interval_s = nvml_interval_s
        self.samples: list[dict[str, Any]] = []
        self.source: str | None = None  # "nvml" or "nvidia-smi", fixed by the first read
        self.errors = 0  # reads that raised: counted for the summary, never allowed to end the thread
        self._halt = threading.Event()  # not _stop: Thread uses that name itself

    def _read(self) -> dict[str, Any]:
        if self.source is None:
            # A reader that opens but yields no field (a MIG slice, say) is no better than none at all.
            try:
                row = nvml.query()
            except Exception:  # noqa: BLE001 - NVML is optional; nvidia-smi still answers
                self.errors += 1
                row = None
            if row:
                self.source = "nvml"
                return row
            self.source = "nvidia-smi"
        if self.source == "nvml":
            return nvml.query() or {}
        return smi_query()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                row = self._read()
            except Exception:  # noqa: BLE001 - a failed sample must not end sampling for the rest of the timing
                self.errors += 1
                row = {}
            if row:
                self.samples.append(row)
            self._halt.wait(self.nvml_interval_s if self.source == "nvml" else self.interval_s)

    def stop(self) -> dict[str, Any]:
        """Stop sampling and summarise: clock ranges, peak temperature and power, union of throttle reasons."""
        self._halt.set()
        self.join(timeout=30)

        def nums(key: str) -> list[float]:
            out = []
            for row in self.samples:
                try:
                    out.append(float(row[key]))
                except (KeyError, ValueError):
                    pass
            return out

        mask = 0
        for row in self.samples:
            try:
                mask |= int(str(row.get("throttle.active")), 16)
            except ValueError:
                pass
        summary: dict[str, Any] = {"samples": len(self.samples), "source": self.source}
        if self.errors:
            summary["errors"] = self.errors
        for key, name in (("clocks.sm", "sm_mhz"), ("clocks.mem", "mem_mhz")):
            values = nums(key)
            if values:
                summary[name] = [min(values), max(values)]
        for key, name in (("temperature.gpu", "temp_c_max"), ("power.draw", "power_w_max")):
            values = nums(key)
            if values:
                summary[name] = max(values)
        summary["throttle.active"] = hex(mask)
        return summary
