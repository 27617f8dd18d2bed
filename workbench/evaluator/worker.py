"""The candidate process: loads one candidate file and runs it on the trusted harness's requests.

Run as ``python -m workbench.evaluator.worker`` with its JSON config on stdin. Everything here shares a process
with untrusted code, so the harness treats every reply as a claim: outputs are re-checked there, and only
failures (never successes) are taken from this side on trust.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import json
import sys
import time
from typing import Any


def _same_bits(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride() or a.device != b.device:
            return False
        return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))
    return a == b


class Worker:
    """Serves load / run / warmup / time / output / exit requests until told to exit or the harness goes away."""

    def __init__(self, cfg: dict[str, Any]):
        import torch

        from workbench.evaluator import timing, wire
        from workbench.evaluator.guards import runtime

        self.torch, self.timing, self.wire, self.guard = torch, timing, wire, runtime
        self.cfg = cfg
        self.device = cfg["device"]
        self.fd_in, self.fd_out = cfg["fd_in"], cfg["fd_out"]
        self.module = None
        self.entry = None
        self.kept: dict[int, dict[str, Any]] = {}
        self.timer = None
        self.modules_before = set(sys.modules)
        self.timers_before = runtime.snapshot_timers()

    # -- helpers -------------------------------------------------------------------------------------------------

    def _fail(self, exc: BaseException) -> dict[str, Any]:
        from workbench.evaluator.diagnose import classify

        info = classify(exc, self.cfg["candidate"], self.cfg["display"], self.module)
        return {"ok": False, **info}

    def _guard(self) -> dict[str, Any] | None:
        """Runtime provenance checks after candidate code ran: forbidden modules loaded, timers replaced."""
        loaded = self.guard.forbidden_modules(set(sys.modules) - self.modules_before, self.cfg["forbidden_imports"])
        if loaded:
            return {"ok": False, "verdict": "forbidden", "fatal": False,
                    "message": f"{self.cfg['display']}: the candidate loaded forbidden module(s) {', '.join(loaded)}"}
        patched = self.guard.replaced_timers(self.timers_before)
        if patched:
            return {"ok": False, "verdict": "forbidden", "fatal": False,
                    "message": f"{self.cfg['display']}: the candidate replaced timing function(s) {', '.join(patched)}"}
        return None

    def _sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def _poison(self, specs: list[dict[str, Any]]) -> None:
        """Fill then free blocks the size of the expected outputs, so an unwritten torch.empty shows NaN."""
        torch = self.torch
        blocks = []
        for spec in specs:
            dtype = getattr(torch, spec["dtype"])
            block = torch.empty(spec["shape"], dtype=dtype, device=self.device)
            if dtype.is_floating_point:
                block.fill_(float("nan"))
            elif dtype == torch.bool:
                block.fill_(True)
            else:
                block.fill_(-1)
            blocks.append(block)
        self._sync()
        del blocks

    def _package(self, value: Any) -> tuple[list[Any], list[dict[str, Any]]]:
        """Copy returned tensors off the candidate's buffers right after sync, and describe every value."""
        torch = self.torch
        values = list(value) if isinstance(value, (tuple, list)) else [value]
        outs, meta = [], []
        for v in values:
            t = type(v)
            info: dict[str, Any] = {"type": f"{t.__module__}.{t.__qualname__}"}
            if t is torch.Tensor:
                info.update(dtype=str(v.dtype), shape=list(v.shape), stride=list(v.stride()), device=str(v.device))
                outs.append(v.detach().to("cpu", copy=True))
            else:
                outs.append(None)
            meta.append(info)
        return outs, meta

    def _mutated(self, entry: dict[str, Any]) -> list[str]:
        return [k for k, v in entry["pristine"].items() if not _same_bits(entry["inputs"][k], v)]

    def _call(self, entry: dict[str, Any]) -> Any:
        out = self.entry(**entry["inputs"])  # type: ignore[misc]
        self._sync()
        return out

    # -- requests ------------------------------------------------------------------------------------------------

    def op_load(self, msg: dict[str, Any]) -> dict[str, Any]:
        path, display = self.cfg["candidate"], self.cfg["display"]
        try:
            spec = importlib.util.spec_from_file_location("candidate", path)
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules["candidate"] = module
            self.module = module
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except BaseException as exc:  # noqa: BLE001 - anything the candidate raises at import is its failure
            reply = self._fail(exc)
            if reply["verdict"] == "crash" and not reply["fatal"]:
                reply["verdict"] = "compile_error"  # failing to import is "does not build", not a runtime crash
            return reply
        entry = getattr(module, self.cfg["entry"], None)
        if not callable(entry):
            return {"ok": False, "verdict": "compile_error", "fatal": False,
                    "message": f"{display}: defines no callable {self.cfg['entry']}()"}
        self.entry = entry
        return self._guard() or {"ok": True}

    def op_run(self, msg: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        inputs = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in msg["inputs"].items()}
        pristine = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        entry = {"inputs": inputs, "pristine": pristine, "last": None}
        self._poison(msg["specs"])
        t0 = time.perf_counter()
        try:
            value = self._call(entry)
        except BaseException as exc:  # noqa: BLE001
            return self._fail(exc)
        ms = (time.perf_counter() - t0) * 1e3
        guard = self._guard()
        if guard:
            return guard
        outs, meta = self._package(value)
        del value
        mutated = self._mutated(entry)
        if msg.get("keep"):
            self.kept[msg["key"]] = entry
        return {"ok": True, "outputs": outs, "meta": meta, "mutated": mutated, "ms": ms}

    def _timer(self) -> Any:
        if self.timer is None:
            self.timer = self.timing.Timer(self.device)
            if self.device == "cuda":
                self.timing.pin_cpu(1)
        return self.timer

    def op_warmup(self, msg: dict[str, Any]) -> dict[str, Any]:
        entry = self.kept[msg["key"]]
        try:
            est = self._timer().warmup(self.entry, entry["inputs"], msg["n"])
        except BaseException as exc:  # noqa: BLE001
            return self._fail(exc)
        return self._guard() or {"ok": True, "ms": est}

    def op_time(self, msg: dict[str, Any]) -> dict[str, Any]:
        entry = self.kept[msg["key"]]
        try:
            ms, wall, last = self._timer().block(self.entry, entry["inputs"], msg["n"])
        except BaseException as exc:  # noqa: BLE001
            return self._fail(exc)
        entry["last"] = last
        return self._guard() or {"ok": True, "ms": ms, "wall": wall}

    def op_output(self, msg: dict[str, Any]) -> dict[str, Any]:
        entry = self.kept[msg["key"]]
        outs, meta = self._package(entry["last"])
        return {"ok": True, "outputs": outs, "meta": meta, "mutated": self._mutated(entry)}

    def serve(self) -> int:
        """Answer requests in order; exit 0 when the harness says so or closes the pipe."""
        ops = {"load": self.op_load, "run": self.op_run, "warmup": self.op_warmup,
               "time": self.op_time, "output": self.op_output}
        while True:
            frame = self.wire.read_frame(self.fd_in, self.cfg["max_frame"])
            if frame is None:
                return 0
            msg = self.wire.load_torch(frame)
            if msg["op"] == "exit":
                return 0
            reply = ops[msg["op"]](msg)
            self.wire.write_frame(self.fd_out, self.wire.dump_torch(reply))
            if reply.get("fatal"):
                return 3  # a CUDA fault leaves the context unusable: never run anything else in it


def main() -> int:
    """Entry point: read the config, import torch and triton before the candidate, then serve."""
    faulthandler.enable()
    cfg = json.loads(sys.stdin.read())
    import numpy  # noqa: F401  - loaded before the candidate so it is not counted as the candidate's import
    import torch
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    if cfg["device"] == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return Worker(cfg).serve()


if __name__ == "__main__":
    sys.exit(main())
