"""The trusted process: makes inputs, computes reference and baseline, drives the candidate worker, checks and times.

Run as ``python -m workbench.evaluator.harness`` with its JSON config on stdin. Expected outputs exist only here;
the candidate worker gets its own copy of the inputs and sends back its outputs, which are checked here. The
harness reports measurements (never a verdict of "ok") to the parent evaluator over a pipe the parent owns.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import json
import math
import random
import sys
import traceback
from pathlib import Path
from typing import Any


class WorkerLost(Exception):
    """The candidate process closed its pipe or sent garbage: it died, or it is not playing by the protocol."""


def _import_file(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class Harness:
    """One evaluation: load, correctness over shapes x seeds, interleaved timing, re-validation."""

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.fd_parent = cfg["fd_parent"]
        self.device = cfg["device"]
        self.stage: dict[str, Any] = {"stage": "startup"}
        self.rng = random.Random()
        self.warnings: list[str] = []

    # -- channels ------------------------------------------------------------------------------------------------

    def tell(self, msg: dict[str, Any]) -> None:
        """Send a JSON message to the parent."""
        from workbench.evaluator import wire

        wire.write_frame(self.fd_parent, wire.dump_json(msg))

    def progress(self, stage: str, budget: str, **where: Any) -> None:
        """Announce what the worker is about to do, so a timeout can say where it hung."""
        self.stage = {"stage": stage, **where}
        self.tell({"type": "stage", "budget_s": self.cfg["budgets"][budget], **self.stage})

    def ask(self, msg: dict[str, Any], limit: int) -> dict[str, Any]:
        """Send a request to the worker and wait for its reply (the parent enforces the deadline).

        Raises:
            WorkerLost: the pipe closed or the reply is not a readable weights-only payload.
        """
        from workbench.evaluator import wire

        try:
            wire.write_frame(self.cfg["fd_worker_out"], wire.dump_torch(msg))
            frame = wire.read_frame(self.cfg["fd_worker_in"], limit)
        except (BrokenPipeError, wire.WireError) as exc:
            raise WorkerLost(str(exc)) from None
        if frame is None:
            raise WorkerLost("the candidate process closed its pipe")
        try:
            reply = wire.load_torch(frame)
        except wire.WireError as exc:
            raise WorkerLost(f"the candidate process sent an unreadable reply ({exc})") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            raise WorkerLost("the candidate process sent a reply that is not a status dict")
        return reply

    # -- setup ---------------------------------------------------------------------------------------------------

    def setup(self) -> bool:
        import torch

        from workbench.evaluator import envinfo

        self.torch = torch
        if self.device == "cuda":
            if not torch.cuda.is_available():
                self.tell({"type": "usage_error", "message": "CUDA was requested but torch.cuda.is_available() is False"})
                return False
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        task_dir = str(Path(self.cfg["reference"]).parent)
        sys.path.insert(0, task_dir)  # a reference may import helpers from its own task folder
        self.reference = _import_file(self.cfg["reference"], "workbench_task_reference")
        self.baseline_name = "reference"
        self.baseline_fn = self.reference.forward
        if self.cfg.get("baseline"):
            base = _import_file(self.cfg["baseline"], "workbench_task_baseline")
            if base.available():
                self.baseline_name = str(base.NAME)
                self.baseline_fn = base.forward
            else:
                self.warnings.append(f"baseline {getattr(base, 'NAME', '?')} unavailable here; timed against the reference")
        self.env = envinfo.collect(self.device)
        self.tell({"type": "env", "env": self.env, "baseline": self.baseline_name})
        return True

    # -- correctness ---------------------------------------------------------------------------------------------

    def _clone(self, inputs: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}

    def _expected(self, inputs: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        from workbench.evaluator import checks

        ref = checks.as_outputs(self.reference.forward(**self._clone(inputs)))
        names = self.cfg["outputs"]
        if len(ref) != len(names):
            raise RuntimeError(f"reference returned {len(ref)} outputs, task.toml lists {len(names)}")
        for name, t in zip(names, ref):
            checks.check_reference(name, t)
        return ref, checks.expected_dtypes(self.reference, inputs, ref)

    def _frame_limit(self, expected: list[Any]) -> int:
        """The largest reply we accept: a few times the expected outputs, so a flood cannot exhaust memory."""
        nbytes = sum(t.numel() * 8 for t in expected)
        return 4 * nbytes + (64 << 20)

    def check_shape(self, row: dict[str, Any], shape: dict[str, Any], key: int) -> dict[str, Any] | None:
        """Correctness of one shape over every seed; returns a worker failure that ends the evaluation."""
        from workbench.evaluator import checks

        torch = self.torch
        names, tols = self.cfg["outputs"], self.cfg["tols"]
        row.update(correct=None, rel_err=None, baseline_rel_err=None, seeds_checked=0, problem=None)
        for seed in self.cfg["seeds"]:
            inputs = self.reference.make_inputs(dict(shape["params"]), seed, self.device)
            expected, dtypes = self._expected(inputs)
            base_out = checks.as_outputs(self.baseline_fn(**self._clone(inputs)))
            base_err = max((checks.rel_rms(r, b) for r, b in zip(expected, base_out)), default=0.0)
            row["baseline_rel_err"] = max(row["baseline_rel_err"] or 0.0, base_err)
            specs = [{"shape": list(t.shape), "dtype": str(d).removeprefix("torch.")} for t, d in zip(expected, dtypes)]
            sent = {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
            keep = seed == self.cfg["seeds"][0]
            self.progress("forward", "call", group=row["group"], shape=shape["name"], seed=seed)
            reply = self.ask({"op": "run", "key": key, "inputs": sent, "specs": specs, "keep": keep},
                             self._frame_limit(expected))
            del sent
            if not reply["ok"]:
                if reply.get("verdict") == "incorrect":
                    row.update(correct=False, problem=f"seed {seed}: {reply.get('message')}")
                    return None
                return reply
            row["seeds_checked"] += 1
            if reply.get("mutated"):
                row.update(correct=False, problem=f"seed {seed}: forward modified its input(s) "
                                                  f"{', '.join(map(str, reply['mutated']))} in place")
                return None
            outs = [o.to(self.device) if isinstance(o, torch.Tensor) else o for o in reply["outputs"]]
            verdict = checks.compare(outs, reply["meta"], expected, dtypes, names, tols, self.device)
            for err in verdict["rel_err"].values():
                if err is not None:
                    err = err if err == err else math.inf  # NaN compares false with everything; inf sorts last
                    row["rel_err"] = err if row["rel_err"] is None else max(row["rel_err"], err)
            if not verdict["ok"]:
                row.update(correct=False, problem=f"seed {seed}: {verdict['problem']}")
                return None
            if keep:
                self.kept[key] = {"inputs": inputs, "expected": expected, "dtypes": dtypes}
        row["correct"] = True
        tol = min(tols)
        if row["baseline_rel_err"] is not None and row["baseline_rel_err"] > 0.8 * tol:
            self.warnings.append(f"{shape['name']}: the baseline's own error {row['baseline_rel_err']:.2g} "
                                 f"is above 0.8x the tolerance {tol:.2g}")
        return None

    # -- timing --------------------------------------------------------------------------------------------------

    def time_shape(self, row: dict[str, Any], key: int, order: int) -> dict[str, Any] | None:
        """Warm up both sides, then alternate blocks of baseline and candidate reps; re-validate afterwards."""
        from workbench.evaluator import checks, timing

        kept = self.kept[key]
        base_inputs = self._clone(kept["inputs"])
        cuda = self.device == "cuda"
        if cuda:
            warm_n = self.rng.randint(3, 8)  # random, so warm-up and measurement look alike (HARNESS.md T4)
            self.progress("warmup", "time", group=row["group"], shape=row["name"])
            reply = self.ask({"op": "warmup", "key": key, "n": warm_n}, 1 << 20)
            if not reply["ok"]:
                return reply
            est = max(float(reply["ms"]), self.timer.warmup(self.baseline_fn, base_inputs, warm_n))
        else:
            est = 0.0  # the interpreter was warmed by the correctness calls and gets a fixed rep count
        reps = timing.plan_reps(est, self.device)
        blocks = min(self.cfg["blocks"], reps) if cuda else reps
        per_block = max(1, math.ceil(reps / blocks))
        cand_ms: list[float] = []
        cand_wall: list[float] = []
        base_ms: list[float] = []
        base_wall: list[float] = []
        sides = ["candidate", "baseline"] if order % 2 == 0 else ["baseline", "candidate"]
        self.progress("timing", "time", group=row["group"], shape=row["name"])
        for _ in range(blocks):
            for side in sides:
                if side == "candidate":
                    reply = self.ask({"op": "time", "key": key, "n": per_block}, 1 << 24)
                    if not reply["ok"]:
                        return reply
                    cand_ms += [float(x) for x in reply["ms"]]
                    cand_wall += [float(x) for x in reply["wall"]]
                else:
                    ms, wall, _ = self.timer.block(self.baseline_fn, base_inputs, per_block)
                    base_ms += ms
                    base_wall += wall
        self.progress("revalidate", "call", group=row["group"], shape=row["name"])
        reply = self.ask({"op": "output", "key": key}, self._frame_limit(kept["expected"]))
        if not reply["ok"]:
            return reply
        outs = [o.to(self.device) if isinstance(o, self.torch.Tensor) else o for o in reply["outputs"]]
        verdict = checks.compare(outs, reply["meta"], kept["expected"], kept["dtypes"], self.cfg["outputs"],
                                 self.cfg["tols"], self.device)
        problem = None
        if reply.get("mutated"):
            problem = f"forward modified its input(s) {', '.join(map(str, reply['mutated']))} during timing"
        elif not verdict["ok"]:
            problem = f"after the timing loop: {verdict['problem']}"
        c, b = timing.summarize(cand_ms), timing.summarize(base_ms)
        row.update(
            ms=c["median"], ms_iqr=c["iqr"], ms_min=c["min"],
            baseline_ms=b["median"], baseline_ms_iqr=b["iqr"],
            wall_ms=timing.summarize(cand_wall)["median"], baseline_wall_ms=timing.summarize(base_wall)["median"],
            reps=len(cand_ms), revalidated=problem is None,
        )
        if problem:
            row.update(correct=False, problem=problem)
        return None

    # -- main ----------------------------------------------------------------------------------------------------

    def run(self) -> None:
        if not self.setup():
            return
        self.kept: dict[int, dict[str, Any]] = {}
        self.progress("load", "load")
        reply = self.ask({"op": "load"}, 1 << 20)
        rows: list[dict[str, Any]] = []
        if not reply["ok"]:
            self.finish(rows, reply)
            return
        keys: dict[str, int] = {}
        for group in self.cfg["groups"]:
            for shape in group["shapes"]:
                row = {"name": shape["name"], "group": group["group"], "role": group["role"]}
                rows.append(row)
                keys[shape["name"]] = len(keys)
                failure = self.check_shape(row, shape, keys[shape["name"]])
                if failure:
                    self.finish(rows, failure)
                    return
        if any(r["correct"] is False for r in rows):
            self.finish(rows, None)
            return
        from workbench.evaluator import envinfo, timing

        sampler = None
        if self.device == "cuda":
            timing.pin_cpu(0)
            sampler = envinfo.ClockSampler()
            sampler.start()
        self.timer = timing.Timer(self.device)
        failure = None
        try:
            for order, row in enumerate(rows):
                failure = self.time_shape(row, keys[row["name"]], order)
                if failure:
                    break
        finally:
            if sampler is not None:
                during = sampler.stop()
                self.env["clocks_during"] = during
                reason = envinfo.throttled(during)
                if reason:
                    self.warnings.append(f"GPU clocks were throttled during timing (reasons {reason})")
        self.finish(rows, failure)

    def finish(self, rows: list[dict[str, Any]], failure: dict[str, Any] | None) -> None:
        """Send the final measurements; a worker failure (compile error, crash, forbidden) rides along."""
        from workbench.evaluator import timing

        if failure is not None:
            failure = {"verdict": failure.get("verdict", "crash"), "message": str(failure.get("message", ""))[:2000],
                       "stage": dict(self.stage)}
        self.tell({
            "type": "result",
            "failure": failure,
            "rows": rows,
            "env": self.env,
            "baseline": self.baseline_name,
            "timing": {
                "method": "cuda events around each call, L2 flush enqueued before each rep, device-wide sync after "
                          "each rep, host wall time from call to after that sync, interleaved A/B blocks"
                if self.device == "cuda" else "host perf_counter (Triton interpreter), not comparable",
                "flush_mb": timing.FLUSH_BYTES >> 20 if self.device == "cuda" else 0,
                "flush_ms": getattr(getattr(self, "timer", None), "flush_ms", None),
                "blocks": self.cfg["blocks"] if self.device == "cuda" else 1,
            },
            "warnings": self.warnings,
        })
        try:
            from workbench.evaluator import wire

            wire.write_frame(self.cfg["fd_worker_out"], wire.dump_torch({"op": "exit"}))
        except OSError:
            pass


def main() -> int:
    """Entry point: read the config from stdin, run, and report any failure of our own as harness_error."""
    faulthandler.enable()
    cfg = json.loads(sys.stdin.read())
    harness = Harness(cfg)
    try:
        harness.run()
    except WorkerLost as exc:
        harness.tell({"type": "worker_lost", "detail": str(exc), "stage": harness.stage})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which owns the verdict
        tb = traceback.format_exc(limit=8)
        harness.tell({"type": "harness_error", "message": f"{type(exc).__name__}: {exc}"[:500],
                      "traceback": tb[-4000:], "stage": harness.stage})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
