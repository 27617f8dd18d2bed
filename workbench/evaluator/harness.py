"""The trusted evaluation service process: the task's reference and baseline, oracle outputs, and the timing.

Run as ``python -m workbench.evaluator.harness DEVICE`` with its JSON configuration on stdin; it lives as long as
its owner (workbench.evaluator.service) wants, and serves evaluations one after another. It imports the task's
reference and baseline once, warms up (compiles, autotunes) the baseline once per shape, keeps the oracle's outputs
for the secret seed pool in bounded memory (never on disk), and between evaluations prepares what the next one
will need: baseline warm-ups, oracle outputs, fresh timing sets. Each evaluation arrives on a Unix socket with the
pipe ends of a fresh, pre-started candidate process (workbench.evaluator.worker); candidate code never runs here.
The service reports steps and measurements (never a verdict of "ok") to its owner over a pipe the owner holds.
"""

from __future__ import annotations

import faulthandler
import json
import select
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable

from workbench.evaluator import limits, tuned
from workbench.evaluator.channel import Channel, WorkerLost
from workbench.evaluator.oracle import OracleCache, Prepared
from workbench.evaluator.trusted import Baseline, ShapeState
from workbench.evaluator.seeds import SeedPool
from workbench.evaluator.stats import StopRule

REQUEST_BYTES = 1 << 20
"""Largest request the owner sends (a JSON object; its pipe ends travel beside it)."""
BASELINE_WARM_CALLS = 3
"""Calls that warm the baseline up on a shape (the first compiles and autotunes); the later ones time it."""


class ServiceFault(Exception):
    """A failure of the trusted side (the baseline or the oracle), not of any candidate."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        """"baseline", "oracle" or "inputs"."""


class Service:
    """The service's state and its request loop."""

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.device: str = cfg["device"]
        self.channel = Channel(cfg["fd_parent"])
        self.requests = socket.socket(fileno=cfg["fd_requests"])
        self.task_hash: str = cfg["task_hash"]
        self.outputs: list[str] = list(cfg["outputs"])
        self.tols: list[float] = list(cfg["tols"])
        self.shapes: dict[str, ShapeState] = {}
        self.pool = SeedPool(int(cfg["seeds"]), secret=bool(cfg["secret"]), refresh_every=int(cfg["refresh_every"]))
        self.stop_rule = StopRule(target=float(cfg["precision"]))
        for group in cfg["groups"]:
            for shape in group["shapes"]:
                state = ShapeState(shape["name"], group["group"], group["role"], dict(shape["params"]))
                state.limits = self._limits(state)
                self.shapes[shape["name"]] = state
        self.fresh_count = int(cfg["fresh_sets"])
        """Fresh timing sets per shape per evaluation."""
        self.cache = OracleCache(int(cfg["cache_bytes"]))
        self.timing_cpu: int | None = cfg["cpus"][0] if cfg.get("cpus") else None
        """The CPU the service pins itself to while it times (the candidate process gets the second)."""
        self.torch: Any = None
        self.reference: Any = None
        self.baseline: Baseline | None = None
        self.timer: Any = None
        self.env: dict[str, Any] = {}
        self._env_thread: threading.Thread | None = None
        self._overhead: float | None | bool = False
        """The timed window's fixed overhead (profiling.launch_overhead), measured once; False until then."""
        self._precompiled = False
        self.precompiled: dict[str, Any] | None = None
        """What the parallel precompile took on this machine (None when it did not run)."""
        self.tuned: tuned.Replay | None = None
        """The baseline's recorded autotuning choices replayed at start (None: no autotuned baseline on CUDA)."""
        self._baseline_modules: list[str] = []
        """The modules the baseline's import brought (whose autotuners the choices are for)."""
        self.evaluations = 0
        self.idle_work = True
        """Whether an idle step may still find something to prepare."""

    # -- start -------------------------------------------------------------------------------------------------

    def start(self) -> bool:
        """Import torch, the reference and the baseline, make the timer; tell the owner ready (or why not)."""
        import torch

        from workbench.evaluator import timing
        from workbench.evaluator.loading import import_file

        self.torch = torch
        if self.device == "cuda":
            if not torch.cuda.is_available():
                self.channel.tell({"type": "usage_error",
                                   "message": "CUDA was requested but torch.cuda.is_available() is False"})
                return False
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        # nvidia-smi takes a while: collect the environment beside the first evaluation instead of before it.
        self._env_thread = threading.Thread(target=self._collect_env, name="envinfo", daemon=True)
        self._env_thread.start()
        task_dir = str(Path(self.cfg["reference"]).parent)
        sys.path.insert(0, task_dir)  # a reference may import helpers from its own task folder
        try:
            self.reference = import_file(self.cfg["reference"], "workbench_task_reference")
            self.baseline = Baseline("reference", self.reference.forward)
            if self.cfg.get("baseline"):
                before = set(sys.modules)
                base = import_file(self.cfg["baseline"], "workbench_task_baseline")
                if base.available():
                    self._baseline_modules = sorted(set(sys.modules) - before)
                    self.baseline = Baseline(str(base.NAME), base.forward, autotuned=any(
                        tuned.autotuners(self._baseline_modules)))
                    if self.baseline.autotuned and self.device == "cuda":
                        self.tuned = tuned.replay(task_dir, torch.cuda.get_device_name(), self._baseline_modules)
                else:
                    self.baseline.note = (f"baseline {getattr(base, 'NAME', '?')} unavailable here; timed against "
                                          "the reference")
        except Exception as exc:  # noqa: BLE001 - a broken task folder: a usage error with the reason
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.channel.tell({"type": "usage_error", "message": f"the task's reference or baseline failed to import: "
                               f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})"[:500]})
            return False
        self.timer = timing.Timer(self.device)
        self.channel.tell({"type": "ready", "baseline": self.baseline.name})
        return True

    def _collect_env(self) -> None:
        from workbench.evaluator import envinfo

        try:
            self.env = envinfo.collect(self.device)
        except Exception as exc:  # noqa: BLE001 - the environment report must never fail an evaluation
            self.env = {"device": self.device, "error": f"{type(exc).__name__}: {exc}"[:200]}
        try:
            self.channel.tell({"type": "env", "env": self.env})  # early, so a crash or a timeout still names the GPU
        except OSError:
            pass

    # -- trusted steps ------------------------------------------------------------------------------------------

    def groups(self, heldout: bool) -> list[dict[str, Any]]:
        """The shape groups an evaluation runs: the public one, then the held-out one when asked."""
        return [g | {"shapes": [s["name"] for s in g["shapes"]]} for g in self.cfg["groups"]
                if g["role"] == "public" or heldout]

    def inputs(self, shape: ShapeState, seed: int) -> dict[str, Any]:
        """make_inputs for one seed on this device (deterministic: the candidate process draws the same)."""
        return self.reference.make_inputs(dict(shape.params), seed, self.device)

    def _sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def warm(self, shape: ShapeState) -> None:
        """Warm the baseline up on a shape (compile, autotune) and time its call; once per shape per service.

        Raises:
            ServiceFault: the baseline failed on the shape.
        """
        if shape.warm:
            return
        import time

        from workbench.evaluator import inputs as inputs_mod

        assert self.baseline is not None
        self._precompile()
        self.channel.announce("baseline", limits.TRUSTED_S["baseline"], trusted=True, shape=shape.name,
                              group=shape.group)
        try:
            inputs = self.inputs(shape, self.pool.seeds(shape.name)[0])
            times = []
            for _ in range(BASELINE_WARM_CALLS):
                buf = inputs_mod.clone(inputs)
                t0 = time.perf_counter()
                self.baseline.fn(**buf)
                self._sync()
                times.append((time.perf_counter() - t0) * 1e3)
        except Exception as exc:  # noqa: BLE001 - the trusted side's failure, reported as such
            self._recover_memory(exc)
            shape.error = f"baseline {self.baseline.name} failed on shape {shape.name}: {type(exc).__name__}: {exc}"
            raise ServiceFault("baseline", shape.error[:500]) from None
        shape.baseline_ms = min(times[1:] or times)
        shape.warm, shape.error = True, None
        shape.limits = self._limits(shape)

    def _limits(self, shape: ShapeState) -> limits.ShapeLimits:
        """A shape's limits from its baseline's call time (the floor until the baseline is warm)."""
        checked = self.pool.size + 1  # the correctness seeds and the re-validation
        return limits.shape_limits(shape.baseline_ms, self.device, checked, self.stop_rule.max_side_ms)

    def _precompile(self) -> None:
        """On a machine that never ran this baseline: compile its autotuning configs for every shape at once, in
        parallel processes (precompile.py), before the first warm-up autotunes on a quiet GPU. Once per service."""
        if self._precompiled or self.device != "cuda" or self.baseline is None or not self.baseline.autotuned:
            return
        self._precompiled = True
        from workbench.evaluator import precompile

        marker = precompile.marker_path(self.task_hash)
        if marker.exists():
            return
        shapes = [s.params for s in self.shapes.values() if s.role == "public" or self.cfg.get("prepare_heldout")]
        self.channel.announce("precompile", limits.TRUSTED_S["baseline"], trusted=True)
        self.precompiled = precompile.run({"reference": self.cfg["reference"], "baseline": self.cfg["baseline"],
                                           "task_dir": str(Path(self.cfg["reference"]).parent)}, shapes,
                                          replayed=bool(self.tuned and self.tuned["applied"]))
        if self.precompiled["ok"] == self.precompiled["shapes"]:
            marker.touch()

    def expected(self, shape: ShapeState, seed: int, slot: int) -> Prepared:
        """The oracle's outputs for a pool seed, from the cache or computed now (then cached)."""
        key = (self.task_hash, shape.name, seed)
        entry = self.cache.get(key)
        if entry is None:
            entry = self._prepare(shape, seed, slot, with_baseline=True)
            self.cache.put(key, entry)
        return entry

    def fresh_sets(self, shape: ShapeState, n: int) -> list[Prepared]:
        """n timing sets no evaluation has used: prepared ahead where there are any, else made now."""
        out = []
        while shape.fresh and len(out) < n:
            out.append(shape.fresh.popleft())
        while len(out) < n:
            slot = len(out)
            out.append(self._prepare(shape, self.pool.fresh(shape.name, slot), slot, with_baseline=False))
        self.idle_work = True
        return out

    def _prepare(self, shape: ShapeState, seed: int, slot: int, *, with_baseline: bool) -> Prepared:
        """Run the oracle (and the baseline, for its own error) on one seed's inputs; one retry after freeing
        the cache when the GPU runs out of memory.

        Raises:
            ServiceFault: the oracle failed (or ran out of memory twice), or the baseline failed.
        """
        for attempt in (1, 2):
            self.channel.announce("oracle", limits.TRUSTED_S["oracle"], trusted=True, shape=shape.name,
                                  group=shape.group, seed=slot)
            try:
                return self._prepare_once(shape, seed, with_baseline)
            except ServiceFault:
                raise
            except Exception as exc:  # noqa: BLE001 - the trusted side's failure, reported as such
                oom = self._recover_memory(exc)
                if oom and attempt == 1:
                    continue
                what = "ran out of memory" if oom else f"failed ({type(exc).__name__}: {exc})"
                raise ServiceFault("oracle", f"the oracle {what} on shape {shape.name}"[:500]) from None
        raise AssertionError("unreachable")

    def _prepare_once(self, shape: ShapeState, seed: int, with_baseline: bool) -> Prepared:
        from workbench.evaluator import checks, inputs as inputs_mod

        inputs = self.inputs(shape, seed)
        fingerprint = inputs_mod.fingerprint(inputs)
        ref = checks.as_outputs(self.reference.forward(**inputs_mod.clone(inputs)))
        if len(ref) != len(self.outputs):
            raise RuntimeError(f"reference returned {len(ref)} outputs, task.toml lists {len(self.outputs)}")
        for name, t in zip(self.outputs, ref):
            checks.check_reference(name, t)
        dtypes = checks.expected_dtypes(self.reference, inputs, ref)
        base_err: dict[str, float] = {}
        if with_baseline:
            self.warm(shape)
            try:
                base_out = checks.as_outputs(self.baseline.fn(**inputs_mod.clone(inputs)))  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001
                self._recover_memory(exc)
                raise ServiceFault("baseline", f"baseline {self.baseline.name} failed on shape {shape.name}: "  # type: ignore[union-attr]
                                   f"{type(exc).__name__}: {exc}"[:500]) from None
            for name, r, b in zip(self.outputs, ref, base_out):
                base_err[name] = checks.rel_rms(r, b)
        nbytes = sum(t.numel() * t.element_size() for t in ref)
        self._sync()
        return Prepared(seed, ref, dtypes, fingerprint, base_err, nbytes)

    def _recover_memory(self, exc: BaseException) -> bool:
        """After a failure on the trusted side: if it was out-of-memory, drop every cached output and the
        allocator's cache (the next attempt gets the room). Returns whether it was."""
        oom = isinstance(exc, self.torch.OutOfMemoryError) or "out of memory" in str(exc).lower()
        if oom:
            self.cache.clear()
            for shape in self.shapes.values():
                shape.fresh.clear()
        self._release_memory()
        return oom

    def _release_memory(self) -> None:
        """Give the allocator's cached blocks back to the GPU, where the next candidate process needs them."""
        if self.device == "cuda":
            try:
                self.torch.cuda.synchronize()
                self.torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001 - the context itself is broken: the health check will say so
                pass

    def launch_overhead(self) -> float | None:
        """The timed window's fixed overhead (measured at the first profile; profiling.launch_overhead)."""
        from workbench.evaluator.phases import profiling

        if self._overhead is False:
            self._overhead = profiling.launch_overhead(self.timer)
        return self._overhead  # type: ignore[return-value]

    def healthy(self) -> bool:
        """A small kernel and a sync on the service's own context (after a candidate process faulted)."""
        if self.device != "cuda":
            return True
        try:
            t = self.torch.ones(1 << 12, device="cuda")
            return float(t.sum()) == float(1 << 12)
        except Exception:  # noqa: BLE001
            return False

    # -- an evaluation ------------------------------------------------------------------------------------------

    def prepare_for(self, ev: Any) -> None:
        """Before the candidate's checks: the evaluation's time limit, from each shape's limits (a shape whose
        baseline is not warm yet counts with the floor; check_shape warms it, and its own steps use its real
        limits). Shapes that failed in idle time get one more try."""
        chosen = [self.shapes[name] for g in self.groups(ev.request["heldout"]) for name in g["shapes"]]
        for shape in chosen:
            shape.error = None
        per_shape = {s.name: s.limits for s in chosen}
        total = limits.evaluation_limit(list(per_shape.values()), self.device)
        ev.limits = limits.as_dict(per_shape, total)
        self.channel.tell({"type": "limits", "evaluation_s": total})

    def finish(self, ev: Any, failure: dict[str, Any] | None, elapsed: float) -> None:
        """Send the final measurements; a worker failure (compile error, crash, forbidden) rides along."""
        from workbench.evaluator import envinfo, timing

        if failure is not None:
            if failure.get("fatal"):  # a CUDA fault in the candidate process: is our own context still sound?
                ev.healthy = self.healthy()
            failure = {"verdict": failure.get("verdict", "crash"), "message": str(failure.get("message", ""))[:2000],
                       "stage": dict(self.channel.stage)}
        if self._env_thread is not None:
            self._env_thread.join(timeout=30)
        env = dict(self.env)
        warnings = list(ev.warnings)
        if self.baseline is not None and self.baseline.note:
            warnings.insert(0, self.baseline.note)
        if ev.clocks_before:
            env["clocks_before"] = ev.clocks_before
        if ev.clocks_during is not None:
            env["clocks_during"] = ev.clocks_during
            reason = envinfo.throttled(ev.clocks_during)
            if reason:
                warnings.append(f"GPU clocks were throttled during timing (reasons {reason})")
        moved = sum(s.bytes_moved for s in (ev.slab_in, ev.slab_out) if s is not None)
        after = self.cache.stats.as_dict()
        cuda = self.device == "cuda"
        self.channel.tell({
            "type": "result",
            "failure": failure,
            "rows": ev.rows,
            "env": env,
            "baseline": self.baseline.name if self.baseline else None,
            "compile": ev.compile_stats,
            "compiles": list(self.channel.compiles),
            "timing": {
                "method": "cuda events around each call; before each rep the inputs are refilled with one of this "
                          "evaluation's fresh input sets and L2 is flushed, outside the window; reps enqueued back "
                          "to back, device-wide sync per block; interleaved A/B blocks until the speedup's 95% "
                          "interval is within the precision target; one isolated host-timed call per block"
                if cuda else "host perf_counter (Triton interpreter), not comparable",
                "precision_target": self.stop_rule.target if cuda else None,
                "min_reps": self.stop_rule.min_reps if cuda else None,
                "flush_mb": timing.FLUSH_BYTES >> 20 if cuda else 0,
                "flush_ms": getattr(self.timer, "flush_ms", None),
                **(self.timer.floors if self.timer is not None else {}),
                "inputs": ("generated in both processes, fingerprint-checked" if ev.generate else "sent via slab"),
                "slab_mb": round(moved / 2**20, 1),
            },
            "seeds": {"secret": self.pool.secret, "pool": self.pool.size, "fresh_sets": self.fresh_count,
                      "refresh_every": self.pool.refresh_every},
            "cache": {k: after[k] - ev.cache_before[k] for k in ("hits", "misses", "evictions")}
                     | {"bytes": after["bytes"], "entries": after["entries"]},
            "limits": ev.limits,
            "worker": ev.worker_info,
            "service": {"evaluations": self.evaluations + 1, "elapsed_s": round(elapsed, 3),
                        **({"precompiled": self.precompiled} if self.precompiled else {}),
                        **({"tuned": self.tuned} if self.tuned else {})},
            "warnings": warnings,
            "healthy": ev.healthy,
        })

    def serve_evaluation(self, request: dict[str, Any], fds: list[int]) -> None:
        """One evaluation, from the candidate process's pipe ends to the final message."""
        from workbench.evaluator import phases, slab

        self.channel.eval_id = int(request["id"])
        ev = phases.Evaluation(self, request)
        healthy = True
        try:
            if len(fds) != 2:
                raise WorkerLost(f"the evaluation request carried {len(fds)} pipe ends, not 2")
            self.channel.attach(fds[0], fds[1])
            ev.slab_out, ev.slab_in = slab.Slab(request["slab_to_worker"]), slab.Slab(request["slab_to_service"])
            phases.run(ev)
            healthy = ev.healthy
        except WorkerLost as exc:
            healthy = self.healthy()
            self.channel.tell({"type": "worker_lost", "detail": str(exc), "stage": self.channel.stage,
                               "healthy": healthy})
        except ServiceFault as exc:
            healthy = self.healthy()
            self.channel.tell({"type": "fault", "kind": exc.kind, "message": str(exc), "stage": self.channel.stage,
                               "healthy": healthy})
        except Exception as exc:  # noqa: BLE001 - reported to the owner, which restarts the service
            self.channel.tell({"type": "harness_error", "message": f"{type(exc).__name__}: {exc}"[:500],
                               "traceback": traceback.format_exc(limit=8)[-4000:], "stage": self.channel.stage})
            healthy = False
        finally:
            self.channel.detach()
            for s in (ev.slab_in, ev.slab_out):
                if s is not None:
                    s.close()
            self.channel.eval_id = None
            self.evaluations += 1
            self.pool.after_evaluation(self.evaluations)
            for name, seed in self.pool.retired:
                self.cache.discard((self.task_hash, name, seed))
            self.pool.retired.clear()
            del ev
            self._release_memory()
            self.idle_work = True
        if not healthy:
            raise SystemExit(4)  # the owner sees the pipe close and starts a new service

    # -- idle time -----------------------------------------------------------------------------------------------

    def _next_idle_job(self) -> tuple[ShapeState, Callable[[], object]] | None:
        """The next thing worth preparing, in order: public shapes first (baseline warm-up, the pool's oracle
        outputs, then the next evaluation's timing sets), held-out shapes after them when the service prepares
        them. None when everything is ready or the memory budget is full."""
        chosen = [s for s in self.shapes.values() if s.role == "public"]
        if self.cfg.get("prepare_heldout"):
            chosen += [s for s in self.shapes.values() if s.role != "public"]
        for shape in chosen:
            if shape.error:
                continue
            if not shape.warm:
                return shape, lambda shape=shape: self.warm(shape)
            for slot, seed in enumerate(self.pool.seeds(shape.name)):
                if (self.task_hash, shape.name, seed) not in self.cache:
                    return shape, lambda shape=shape, seed=seed, slot=slot: self.expected(shape, seed, slot)
        stocked = sum(p.nbytes for s in self.shapes.values() for p in s.fresh)
        for shape in chosen:
            if shape.error or len(shape.fresh) >= self.fresh_count:
                continue
            if self.cache.stats.bytes + stocked > self.cache.budget_bytes:
                return None
            slot = len(shape.fresh)

            def stock(shape: ShapeState = shape, slot: int = slot) -> None:
                seed = self.pool.fresh(shape.name, slot)
                shape.fresh.append(self._prepare(shape, seed, slot, with_baseline=False))

            return shape, stock
        return None

    def idle_step(self) -> bool:
        """Prepare one thing the next evaluation will need; False when nothing is left.

        A failure is remembered on its shape and reported as a fault; the evaluation that needs the shape tries
        once more.
        """
        job = self._next_idle_job()
        if job is None:
            self.channel.announce("idle", None, trusted=True)
            return False
        shape, work = job
        try:
            work()
        except ServiceFault as exc:
            shape.error = str(exc)
            self.channel.tell({"type": "fault", "kind": exc.kind, "message": str(exc), "idle": True})
        return True

    # -- the loop ------------------------------------------------------------------------------------------------

    def serve(self) -> int:
        """Serve requests until the owner says exit or goes away; prepare in between."""
        while True:
            wait = 0.0 if self.idle_work else None
            ready, _, _ = select.select([self.requests], [], [], wait)
            if not ready:
                self.idle_work = self.idle_step()
                continue
            data, fds, _, _ = socket.recv_fds(self.requests, REQUEST_BYTES, 4)
            if not data:
                return 0
            request = json.loads(data)
            if request.get("op") == "exit":
                return 0
            if request.get("op") == "evaluate":
                self.serve_evaluation(request, list(fds))


def _preload(device: str) -> None:
    """What every evaluation on `device` needs, done before the configuration arrives."""
    import torch

    from workbench.evaluator import checks, envinfo, inputs, slab, timing, wire  # noqa: F401
    from workbench.evaluator import phases  # noqa: F401

    if device == "cuda" and torch.cuda.is_available():
        torch.cuda.init()


def main() -> int:
    """Entry point: preload for the device named on the command line, read the configuration from stdin, start,
    serve; a failure of our own is reported as harness_error."""
    faulthandler.enable()
    if len(sys.argv) != 2:
        print("usage: python -m workbench.evaluator.harness DEVICE  (configuration as JSON on stdin)", file=sys.stderr)
        return 2
    _preload(sys.argv[1])
    text = sys.stdin.read()
    if not text.strip():
        return 0
    service = Service(json.loads(text))
    try:
        if not service.start():
            return 0
        return service.serve()
    except SystemExit as exc:
        return int(exc.code or 0)
    except BaseException as exc:  # noqa: BLE001 - reported to the owner, which decides what to do
        try:
            service.channel.tell({"type": "harness_error", "message": f"{type(exc).__name__}: {exc}"[:500],
                                  "traceback": traceback.format_exc(limit=8)[-4000:], "stage": service.channel.stage})
        except OSError:
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())
