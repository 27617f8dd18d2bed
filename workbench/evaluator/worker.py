"""The candidate process: loads one candidate file and runs it on the trusted evaluation service's requests.

Run as ``python -m workbench.evaluator.worker DEVICE IN_FD OUT_FD [--netns]``, pre-started: it isolates itself
(a network namespace of its own where asked and allowed), imports torch and triton, says "ready" on OUT_FD and only
then reads its JSON config (which names the candidate) on stdin. Everything here shares a process with untrusted
code, so the service treats every reply as a claim: outputs are re-checked there against expected outputs that
never enter this process, and only failures (never successes) are taken from this side on trust. Inputs are drawn
here with the task's own make_inputs from seeds the service sends (reported back by fingerprint); tensors travel
through shared slabs, messages as JSON frames. While a request runs, the worker reports Triton compiles starting and
ending, so a compile gets a compile's time limit and a hang the call's short one.
"""

from __future__ import annotations

import faulthandler
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Pool:
    """One shape's input sets in this process and the state of its timing."""

    sets: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Input sets by index: the correctness seeds' (slots), then the timing sets'."""
    timing: list[int] = field(default_factory=list)
    """Indices of the timing sets, in the order they were added."""
    buf: dict[str, Any] | None = None
    """The timing buffers: fixed addresses every timed rep refills with one set's values."""
    last: Any = None
    """The output of the last timed call (what op_output re-checks)."""
    last_set: int | None = None
    """The set that call ran on."""
    graph: tuple[Any, Any] | None = None
    """The captured CUDA graph of forward on buf, and its static output."""


class Worker:
    """Serves load / run / add_sets / warmup / time / output / graph / profile requests until told to exit."""

    def __init__(self, cfg: dict[str, Any], fds: tuple[int, int]):
        import torch

        from workbench.evaluator import inputs, slab, timing, wire
        from workbench.evaluator.guards import runtime

        self.torch, self.timing, self.wire, self.guard, self.inputs = torch, timing, wire, runtime, inputs
        self.cfg = cfg
        self.device = cfg["device"]
        self.fd_in, self.fd_out = fds
        self.slab_in, self.slab_out = slab.Slab(cfg["slab_in"]), slab.Slab(cfg["slab_out"])
        self.module = None
        """The candidate module once op_load made it (even when running it failed)."""
        self.entry = None
        self.pools: dict[int, _Pool] = {}
        self.timer = None
        """The Timer, made at the first timing request (its flush buffer and GPU sleep rate)."""
        self._send_lock = threading.Lock()
        self.make_inputs = self._load_make_inputs()
        self.modules_before = set(sys.modules)
        self.timers_before = runtime.snapshot_timers()
        self.audit = runtime.AuditGuard(cfg["candidate"])
        self._install_compile_hooks()

    def _load_make_inputs(self) -> Any:
        """The task's make_inputs, loaded before the candidate; None when the reference cannot live here.

        A reference that pulls in a forbidden module (or fails to import) would put that module within the
        candidate's reach, so inputs then travel from the service instead.
        """
        from workbench.evaluator.loading import import_file

        before = set(sys.modules)
        try:
            sys.path.insert(0, self.cfg["task_dir"])
            module = import_file(self.cfg["reference"], "workbench_task_inputs")
        except Exception:  # noqa: BLE001 - any failure just means "send the inputs"
            return None
        finally:
            if sys.path and sys.path[0] == self.cfg["task_dir"]:
                sys.path.pop(0)
        if self.guard.forbidden_modules(set(sys.modules) - before, self.cfg["forbidden_imports"]):
            return None
        return getattr(module, "make_inputs", None)

    def _install_compile_hooks(self) -> None:
        """Report the candidate's Triton compiles (main thread only: the warm-up thread's are ours)."""
        try:
            from triton import knobs
        except ImportError:  # an older Triton without knobs: every call keeps the call limit
            return
        main = threading.main_thread()

        def hook(phase: str) -> Any:
            def report(*, fn: Any = None, **_: Any) -> None:
                if threading.current_thread() is main:
                    self.send({"event": "compile", "phase": phase, "kernel": str(getattr(fn, "name", "?"))[:120]})
                return None  # a true value would tell Triton to skip the compile

            return report

        knobs.runtime.jit_cache_hook = hook("start")
        knobs.runtime.jit_post_compile_hook = hook("end")

    def send(self, msg: dict[str, Any]) -> None:
        """Write one frame to the service (replies and compile events may come from inside a call)."""
        with self._send_lock:
            self.wire.write_frame(self.fd_out, self.wire.dump_json(msg))

    # -- helpers -------------------------------------------------------------------------------------------------

    def _violation(self) -> dict[str, Any] | None:
        """The first provenance violation seen so far (audit events, namespace, modules, timers), as a reply."""
        display = self.cfg["display"]
        if self.audit.violations:
            line, message = self.audit.violations[0]
            where = f"{display}:{line}" if line else display
            return {"ok": False, "verdict": "forbidden", "fatal": False, "message": f"{where}: the candidate {message}"}
        loaded = self.guard.forbidden_modules(set(sys.modules) - self.modules_before, self.cfg["forbidden_imports"])
        if loaded:
            return {"ok": False, "verdict": "forbidden", "fatal": False,
                    "message": f"{display}: the candidate loaded forbidden module(s) {', '.join(loaded)}"}
        patched = self.guard.replaced_timers(self.timers_before)
        if patched:
            return {"ok": False, "verdict": "forbidden", "fatal": False,
                    "message": f"{display}: the candidate replaced timing function(s) {', '.join(patched)}"}
        if self.module is not None:
            held = self.guard.namespace_violations(self.module)
            if held:
                return {"ok": False, "verdict": "forbidden", "fatal": False,
                        "message": f"{display}: the candidate holds {', '.join(held[:3])}, which is off its allowlist"}
        return None

    def _fail(self, exc: BaseException) -> dict[str, Any]:
        from workbench.evaluator.diagnose import classify

        violation = self._violation()
        if violation:  # an action the audit hook refused surfaces as an exception: report the refusal
            return violation
        info = classify(exc, self.cfg["candidate"], self.cfg["display"], self.module)
        return {"ok": False, **info}

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

    def _values(self, value: Any) -> list[Any]:
        return list(value) if isinstance(value, (tuple, list)) else [value]

    def _describe(self, value: Any) -> tuple[list[Any], list[dict[str, Any]]]:
        """The returned values as plain tensors (or None) plus what each was, observed before any copy."""
        torch = self.torch
        outs, meta = [], []
        for v in self._values(value):
            t = type(v)
            info: dict[str, Any] = {"type": f"{t.__module__}.{t.__qualname__}"}
            if t is torch.Tensor:
                info.update(dtype=str(v.dtype), shape=list(v.shape), stride=list(v.stride()), device=str(v.device))
                outs.append(v.detach())
            else:
                outs.append(None)
            meta.append(info)
        return outs, meta

    def _call(self, inputs: dict[str, Any]) -> Any:
        out = self.entry(**inputs)  # type: ignore[misc]
        self._sync()
        return out

    def _threads_left(self, before: set[int]) -> dict[str, Any] | None:
        extra = self.guard.python_threads() - before
        if extra:
            return {"ok": False, "verdict": "forbidden", "fatal": False,
                    "message": f"{self.cfg['display']}: forward left {len(extra)} thread(s) running; work must be "
                               "done (and synchronised) before forward returns"}
        return None

    def _draw(self, msg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str] | None]:
        """One input set: sent through the slab, or drawn here from its seed (then reported by fingerprint)."""
        if msg.get("inputs") is not None:
            return self.slab_in.unpack(msg["inputs"], self.device), None
        inputs = self.make_inputs(dict(msg["params"]), int(msg["seed"]), self.device)  # type: ignore[misc]
        return inputs, self.inputs.fingerprint(inputs)

    def _pool(self, key: int) -> _Pool:
        return self.pools.setdefault(key, _Pool())

    # -- requests ------------------------------------------------------------------------------------------------

    def op_load(self, msg: dict[str, Any]) -> dict[str, Any]:
        from workbench.evaluator.loading import new_module, run_module

        display = self.cfg["display"]
        self.audit.install()
        try:
            self.module = new_module(self.cfg["candidate"], "candidate")
            run_module(self.module)
        except BaseException as exc:  # noqa: BLE001 - anything the candidate raises at import is its failure
            reply = self._fail(exc)
            if reply["verdict"] == "crash" and not reply["fatal"]:
                reply["verdict"] = "compile_error"  # failing to import is "does not build", not a runtime crash
            return reply
        entry = getattr(self.module, self.cfg["entry"], None)
        if not callable(entry):
            return {"ok": False, "verdict": "compile_error", "fatal": False,
                    "message": f"{display}: defines no callable {self.cfg['entry']}()"}
        self.entry = entry
        return self._violation() or {"ok": True, "generate": self.make_inputs is not None}

    def op_run(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One checked call: fresh inputs, poisoned allocator, dispatch recording, outputs into the slab."""
        inputs_mod = self.inputs
        inputs, fp = self._draw(msg)
        pristine = inputs_mod.clone(inputs)
        self._poison(msg["specs"])
        recorder = self.guard.make_op_recorder()
        threads = self.guard.python_threads()
        t0 = time.perf_counter()
        try:
            with recorder:
                value = self._call(inputs)
        except BaseException as exc:  # noqa: BLE001
            return self._fail(exc)
        ms = (time.perf_counter() - t0) * 1e3
        guard = self._violation() or self._threads_left(threads)
        if guard:
            return guard
        outs, meta = self._describe(value)
        del value
        packed = self.slab_out.pack(outs)
        mutated = inputs_mod.same(inputs, pristine)
        del pristine
        self._pool(int(msg["key"])).sets[int(msg["index"])] = inputs
        ops = dict(sorted(recorder.disallowed.items(), key=lambda kv: -kv[1]))
        reply: dict[str, Any] = {"ok": True, "outputs": packed, "meta": meta, "mutated": mutated, "ms": ms,
                                 "fingerprint": fp}
        if ops:
            listed = ", ".join(f"{k} (x{v})" for k, v in list(ops.items())[:4])
            reply["ops"] = ops
            reply["ops_message"] = (f"{self.cfg['display']}: forward dispatched torch compute op(s) {listed}; only "
                                    "allocation, view and copy ops may run outside the candidate's Triton kernels")
        return reply

    def op_add_sets(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The timing sets of a shape (fresh seeds); the shape's correctness sets are dropped, timing never uses
        them. Replies with each set's fingerprint."""
        pool = self._pool(int(msg["key"]))
        for index in [i for i in pool.sets if i not in pool.timing]:
            del pool.sets[index]
        fingerprints = {}
        for item in msg["sets"]:
            index = int(item["index"])
            pool.sets[index], fingerprints[str(index)] = self._draw({**item, "params": msg["params"]})
            pool.timing.append(index)
        pool.buf, pool.graph = None, None
        return {"ok": True, "fingerprints": fingerprints}

    def _timer(self) -> Any:
        if self.timer is None:
            self.timer = self.timing.Timer(self.device)
            if self.device == "cuda":
                self.timing.pin_cpu(self.cfg.get("cpu"))
        return self.timer

    def _buf(self, key: int) -> dict[str, Any]:
        """The timing buffers of a shape: fixed addresses that every timed rep refills with one input set."""
        pool = self.pools[key]
        if pool.buf is None:
            pool.buf = self.inputs.clone(pool.sets[pool.timing[0]])
        return pool.buf

    def op_warmup(self, msg: dict[str, Any]) -> dict[str, Any]:
        key = int(msg["key"])
        buf = self._buf(key)
        try:
            est = self._timer().warmup(self.entry, buf, int(msg["n"]))
        except BaseException as exc:  # noqa: BLE001
            return self._fail(exc)
        return self._violation() or {"ok": True, "ms": est}

    def op_time(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One block of timed reps with fresh inputs per rep; outputs of the reps in msg["check"] are kept."""
        torch = self.torch
        key = int(msg["key"])
        pool, buf = self.pools[key], self._buf(key)
        plan = [int(i) for i in msg["plan"]]
        check = {int(i) for i in msg.get("check", [])}
        saved: dict[int, list[Any]] = {}

        def refill(i: int) -> None:
            self.inputs.refill(buf, pool.sets[plan[i]])

        def keep(i: int, out: Any) -> None:
            if i in check:
                saved[i] = [v.detach().clone() if type(v) is torch.Tensor else None for v in self._values(out)]

        timer = self._timer()
        threads = self.guard.python_threads()
        after = int(msg.get("after", plan[-1]))
        try:
            ms, last = timer.block(self.entry, buf, len(plan), refill=refill, keep=keep)
            if self.device == "cuda":
                # One more call, eager and host-timed, on another input set: its output is what "output" re-checks.
                w, last = timer.isolated(self.entry, buf, refill=lambda i: self.inputs.refill(buf, pool.sets[after]))
                wall = [w]
            else:
                wall, after = list(ms), plan[-1]  # the interpreter's reps are host-timed already
        except BaseException as exc:  # noqa: BLE001
            return self._fail(exc)
        guard = self._violation() or self._threads_left(threads)
        if guard:
            return guard
        pool.last, pool.last_set = last, after
        seed = int(msg.get("subset_seed", 0))
        spots = [{"rep": rep, "outputs": self._subset(saved[rep], seed)} for rep in sorted(saved)]
        saved.clear()
        return {"ok": True, "ms": ms, "wall": wall, "spots": self.slab_out.pack(spots)}

    def _subset(self, values: list[Any], seed: int) -> list[Any]:
        """The spot-check sample of each output (the service draws the same indices from its expected outputs)."""
        picked = []
        for j, t in enumerate(values):
            if t is None:
                picked.append(None)
                continue
            flat = t.reshape(-1)
            picked.append(flat[self.inputs.subset_index(flat.numel(), seed + j).to(flat.device)])
        return picked

    def op_graph(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Timed replays of forward captured once as a CUDA graph, fresh inputs per rep; the last rep's output is
        sent back as a spot check. A call that cannot be captured is reported (graph_error), not failed: the
        event timing stands on its own."""
        torch = self.torch
        key = int(msg["key"])
        pool, buf = self.pools[key], self._buf(key)
        plan = [int(i) for i in msg["plan"]]
        timer = self._timer()
        threads = self.guard.python_threads()
        try:
            if pool.graph is None:
                pool.graph = timer.capture(self.entry, buf)
            graph, out = pool.graph
            ms = timer.graph_block(graph, len(plan), refill=lambda i: self.inputs.refill(buf, pool.sets[plan[i]]))
        except BaseException as exc:  # noqa: BLE001
            try:
                torch.cuda.synchronize()  # a capture refused by the driver leaves the context usable ...
            except BaseException:  # noqa: BLE001
                return self._fail(exc)  # ... a fault does not: report it as any other fault
            return self._violation() or {"ok": True, "graph_error": f"{type(exc).__name__}: {exc}"[:300]}
        guard = self._violation() or self._threads_left(threads)
        if guard:
            return guard
        values = [v.detach().clone() if type(v) is torch.Tensor else None for v in self._values(out)]
        spots = [{"rep": len(plan) - 1, "outputs": self._subset(values, int(msg.get("subset_seed", 0)))}]
        return {"ok": True, "ms": ms, "spots": self.slab_out.pack(spots)}

    def op_output(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The last timed call's full outputs, and whether forward changed the buffers it was given."""
        pool = self.pools[int(msg["key"])]
        outs, meta = self._describe(pool.last)
        mutated = self.inputs.same(pool.buf, pool.sets[pool.last_set])  # type: ignore[arg-type, index]
        return {"ok": True, "outputs": self.slab_out.pack(outs), "meta": meta, "mutated": mutated,
                "set": pool.last_set}

    def op_profile(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Calls of every listed shape under one torch.profiler session (CUDA), each after a refill and an L2
        flush, plus Triton's compile stats. Window i is the i-th (key, input set) pair of msg["calls"]."""
        from workbench.profiler import capture

        timer = self._timer()
        jobs = []
        for key, index in msg["calls"]:
            pool, buf = self.pools[int(key)], self._buf(int(key))

            def prepare(pool: _Pool = pool, buf: dict[str, Any] = buf, index: int = int(index)) -> None:
                self.inputs.refill(buf, pool.sets[index])
                timer.flush()

            jobs.append((self.entry, buf, prepare))
        try:
            events = capture.capture(jobs)
        except BaseException as exc:  # noqa: BLE001
            return self._fail(exc)
        stats = capture.triton_stats(vars(self.module)) if self.module is not None else []
        return self._violation() or {"ok": True, "events": events, "compile": stats}

    def serve(self) -> int:
        """Answer requests in order; exit 0 when the service says so or closes the pipe."""
        ops = {"load": self.op_load, "run": self.op_run, "add_sets": self.op_add_sets, "warmup": self.op_warmup,
               "time": self.op_time, "output": self.op_output, "profile": self.op_profile, "graph": self.op_graph}
        while True:
            frame = self.wire.read_frame(self.fd_in, self.cfg["max_frame"])
            if frame is None:
                return 0
            msg = json.loads(frame)
            if msg["op"] == "exit":
                return 0
            reply = ops[msg["op"]](msg)
            self.send(reply)
            if reply.get("fatal"):
                return 3  # a CUDA fault leaves the context unusable: never run anything else in it


def _preload_gluon() -> None:
    """Triton's Gluon dialect (Hopper and Blackwell modules included), loaded before the audit hook like triton
    itself: a candidate may import it, and importing it later would read package files, which the hook refuses."""
    import importlib

    gluon = "triton.experimental.gluon"
    for name in (gluon, f"{gluon}.language", f"{gluon}.language.nvidia.hopper", f"{gluon}.language.nvidia.blackwell",
                 f"{gluon}.nvidia.hopper", f"{gluon}.nvidia.blackwell"):
        try:
            importlib.import_module(name)
        except ImportError:  # an older Triton without Gluon: a candidate importing it fails as it would anywhere
            return


def isolate_and_import(netns: bool) -> dict[str, Any]:
    """Everything a candidate process does before it may touch the GPU: its own network namespace (where asked and
    allowed), then the imports (numpy, torch, triton, Gluon, the worker's own modules). Returns the ready report's
    isolation part ({"netns", "netns_note", "import_s"}).

    The fork server (workbench.evaluator.template) runs this once and forks a child per candidate from there.
    """
    isolated, note = False, "not asked"
    if netns:
        # First, while this process has one thread: unshare(CLONE_NEWUSER) refuses a threaded process.
        from workbench.evaluator.isolation import enter_network_namespace

        isolated, note = enter_network_namespace()
    started = time.perf_counter()
    import numpy  # noqa: F401  - loaded before the candidate so it is not counted as the candidate's import
    import torch
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    _preload_gluon()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # The worker's own modules, imported before the candidate so its sys.modules diff sees only its own imports.
    from workbench.evaluator import diagnose, inputs, loading, prestart, slab, timing, warm, wire  # noqa: F401
    from workbench.evaluator.guards import runtime  # noqa: F401

    return {"netns": isolated, "netns_note": note, "import_s": round(time.perf_counter() - started, 3)}


def serve_when_told(device: str, fd_in: int, fd_out: int, report: dict[str, Any]) -> int:
    """A candidate process's life from "imported" on: wait for "warm" or the config on stdin, create the CUDA context
    and launch Triton once (CUDA), say ready (with `report`), read the config, serve one evaluation."""
    from workbench.evaluator import warm, wire
    from workbench.evaluator.prestart import WARM_LINE

    first = sys.stdin.buffer.readline()
    if not first.strip():
        return 0  # a pre-started process that was never used
    text = b"" if first.strip() == WARM_LINE else first
    if device == "cuda":
        warm.touch("cuda")  # the context and Triton's first launch, in the main thread: no thread of ours remains
    try:
        wire.write_frame(fd_out, wire.dump_json({"ready": True, **report}))
    except OSError:
        return 0  # nobody will ever use this process
    text += sys.stdin.buffer.read()
    if not text.strip():
        return 0
    cfg = json.loads(text)
    if cfg["device"] != device:
        print(f"worker started for {device} but configured for {cfg['device']}", file=sys.stderr)
        return 2
    return Worker(cfg, (fd_in, fd_out)).serve()


def main() -> int:
    """Entry point of a fresh candidate process: isolate and import (no GPU yet), then serve_when_told.

    Everything before the configuration depends only on the device, so the process can be started before anyone
    knows which candidate it will run (workbench.evaluator.prestart). It starts in two parts: imports, which touch
    no GPU and may overlap another evaluation's timing, then (on a "warm" line on stdin, or with the config) the
    CUDA context and Triton's first launch, which wait until nothing is being timed.
    """
    faulthandler.enable()
    args = sys.argv[1:]
    netns = "--netns" in args
    args = [a for a in args if a != "--netns"]
    if len(args) != 3:
        print("usage: python -m workbench.evaluator.worker DEVICE IN_FD OUT_FD [--netns]  (config on stdin)",
              file=sys.stderr)
        return 2
    device, fd_in, fd_out = args[0], int(args[1]), int(args[2])
    report = isolate_and_import(netns)
    return serve_when_told(device, fd_in, fd_out, report)


if __name__ == "__main__":
    sys.exit(main())
