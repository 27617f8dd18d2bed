"""The trusted process: makes inputs, computes reference and baseline, drives the candidate worker, checks and times.

Run as ``python -m workbench.evaluator.harness DEVICE`` with its JSON config on stdin. Expected outputs exist only here;
the worker draws the same inputs with the task's make_inputs (compared by fingerprint) and sends back its outputs
through a shared slab, to be checked here. The harness reports measurements (never a verdict of "ok") to the parent
evaluator over a pipe the parent owns.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import json
import math
import random
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

PROFILE_CALLS = 5
"""Calls per shape recorded with torch.profiler (CUDA): the kernel table and the independent timer."""
BASELINE_PROFILE_CALLS = 2
"""Baseline calls per shape recorded, for its kernel names (HARNESS.md: record what the baseline ran)."""
AGREEMENT_WARN = 0.10
AGREEMENT_WARN_US = 5.0
"""Warn when the event median, less the measured window overhead, and the profiler's kernel sum differ by more than
10% and more than 5 us. Events include about 3 us per call that kernel durations do not (H200, constant across
shapes: launch and completion around the kernel), which alone is over 10% of an 18 us kernel."""
TINY_CALLS = 8
"""One-element kernels profiled to measure a timed window's fixed overhead."""
GRAPH_MIN_REPS = 50
"""CUDA-graph reps per side per shape at least (half the event reps otherwise)."""
ESCAPE_RATIO = 0.5
"""An event median under this fraction of the profiler's kernel sum means work ran outside the timed window."""


class WorkerLost(Exception):
    """The candidate process closed its pipe or sent garbage: it died, or it is not playing by the protocol."""


def _import_file(path: str, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


class Harness:
    """One evaluation: load, correctness over shapes x seeds, interleaved timing with spot checks, profiling."""

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.fd_parent = cfg["fd_parent"]
        self.device = cfg["device"]
        self.stage: dict[str, Any] = {"stage": "startup"}
        self.rng = random.Random()
        self.warnings: list[str] = []
        self.generate = True
        self.env: dict[str, Any] = {}
        self._tell_lock = threading.Lock()  # the environment thread reports beside the main one

    # -- channels ------------------------------------------------------------------------------------------------

    def tell(self, msg: dict[str, Any]) -> None:
        """Send a JSON message to the parent."""
        from workbench.evaluator import wire

        with self._tell_lock:
            wire.write_frame(self.fd_parent, wire.dump_json(msg))

    def progress(self, stage: str, budget: str, **where: Any) -> None:
        """Announce what the worker is about to do, so a timeout can say where it hung."""
        self.stage = {"stage": stage, **where}
        self.tell({"type": "stage", "budget_s": self.cfg["budgets"][budget], **self.stage})

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Send a request to the worker and wait for its reply (the parent enforces the deadline).

        Raises:
            WorkerLost: the pipe closed or the reply is not a JSON status dict.
        """
        from workbench.evaluator import wire

        try:
            wire.write_frame(self.cfg["fd_worker_out"], wire.dump_json(msg))
            frame = wire.read_frame(self.cfg["fd_worker_in"], 1 << 28)
        except (BrokenPipeError, wire.WireError) as exc:
            raise WorkerLost(str(exc)) from None
        if frame is None:
            raise WorkerLost("the candidate process closed its pipe")
        try:
            reply = json.loads(frame)
        except ValueError as exc:
            raise WorkerLost(f"the candidate process sent an unreadable reply ({exc})") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            raise WorkerLost("the candidate process sent a reply that is not a status dict")
        return reply

    def tensors(self, packed: Any) -> Any:
        """Tensors the worker put in its slab, copied onto this device.

        Raises:
            WorkerLost: a descriptor that does not fit the slab (the other side is misbehaving).
        """
        from workbench.evaluator import slab

        try:
            return self.slab_in.unpack(packed, self.device)
        except slab.SlabError as exc:
            raise WorkerLost(f"the candidate process sent a bad tensor descriptor ({exc})") from None

    # -- setup ---------------------------------------------------------------------------------------------------

    def setup(self) -> bool:
        import torch

        from workbench.evaluator import slab

        self.torch = torch
        if self.device == "cuda":
            if not torch.cuda.is_available():
                self.tell({"type": "usage_error", "message": "CUDA was requested but torch.cuda.is_available() is False"})
                return False
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        # nvidia-smi takes a while: collect the environment beside the first requests instead of before them.
        self._env_thread = threading.Thread(target=self._collect_env, name="envinfo", daemon=True)
        self._env_thread.start()
        self.slab_out, self.slab_in = slab.Slab(self.cfg["slab_out"]), slab.Slab(self.cfg["slab_in"])
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
        return True

    def _collect_env(self) -> None:
        from workbench.evaluator import envinfo

        try:
            self.env = envinfo.collect(self.device)
        except Exception as exc:  # noqa: BLE001 - the environment report must never fail an evaluation
            self.env = {"device": self.device, "error": f"{type(exc).__name__}: {exc}"[:200]}
        try:
            self.tell({"type": "env", "env": self.env})  # early, so a crash or a timeout still names the GPU
        except OSError:
            pass

    # -- correctness ---------------------------------------------------------------------------------------------

    def _expected(self, inputs: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        from workbench.evaluator import checks, inputs as inputs_mod

        ref = checks.as_outputs(self.reference.forward(**inputs_mod.clone(inputs)))
        names = self.cfg["outputs"]
        if len(ref) != len(names):
            raise RuntimeError(f"reference returned {len(ref)} outputs, task.toml lists {len(names)}")
        for name, t in zip(names, ref):
            checks.check_reference(name, t)
        return ref, checks.expected_dtypes(self.reference, inputs, ref)

    def check_shape(self, row: dict[str, Any], shape: dict[str, Any], key: int) -> dict[str, Any] | None:
        """Correctness of one shape over every seed; returns a worker failure that ends the evaluation.

        Even-numbered seeds compute the reference before the candidate runs, odd ones after (HARNESS.md C1:
        both orders), and each seed's inputs and expected outputs are kept as the shape's timing pool.
        """
        from workbench.evaluator import checks, inputs as inputs_mod

        names, tols = self.cfg["outputs"], self.cfg["tols"]
        row.update(correct=None, rel_err=None, baseline_rel_err=None, seeds_checked=0, problem=None)
        # Worst error per output over the seeds, candidate and baseline: outputs have their own tolerances.
        cand_by: dict[str, float] = {}
        base_by: dict[str, float] = {}
        pool: list[dict[str, Any]] = []
        self.kept[key] = {"sets": pool, "params": shape["params"]}
        dtypes: list[Any] = []
        specs: list[dict[str, Any]] = []
        for index, seed in enumerate(self.cfg["seeds"]):
            inputs = self.reference.make_inputs(dict(shape["params"]), seed, self.device)
            expected = None
            if index % 2 == 0 or not specs:
                expected, dtypes = self._expected(inputs)
                specs = self._specs(expected, dtypes)
            msg: dict[str, Any] = {"op": "run", "key": key, "index": index, "params": shape["params"], "seed": seed,
                                   "specs": specs}
            if not self.generate:
                msg["inputs"] = self.slab_out.pack(inputs)
            self.progress("forward", "call", group=row["group"], shape=shape["name"], seed=seed)
            reply = self.ask(msg)
            if not reply["ok"]:
                if reply.get("verdict") == "incorrect":
                    row.update(correct=False, problem=f"seed {seed}: {reply.get('message')}")
                    return None
                return reply
            if expected is None:
                expected, dtypes = self._expected(inputs)
            base_out = checks.as_outputs(self.baseline_fn(**inputs_mod.clone(inputs)))
            for out_name, r, b in zip(names, expected, base_out):
                base_by[out_name] = max(base_by.get(out_name, 0.0), checks.rel_rms(r, b))
            row["baseline_rel_err"] = max(base_by.values(), default=0.0)
            if self.generate and reply.get("fingerprint") != inputs_mod.fingerprint(inputs):
                return {"verdict": "forbidden", "message": "the inputs in the candidate process differ from the "
                        "harness's (fingerprint mismatch): make_inputs was altered there, or it is not deterministic"}
            row["seeds_checked"] += 1
            row.setdefault("call_ms", []).append(round(float(reply.get("ms", 0.0)), 3))  # the first holds compiles
            if reply.get("mutated"):
                row.update(correct=False, problem=f"seed {seed}: forward modified its input(s) "
                                                  f"{', '.join(map(str, reply['mutated']))} in place")
                return None
            outs = self.tensors(reply["outputs"])
            verdict = checks.compare(outs, reply["meta"], expected, dtypes, names, tols, self.device)
            for out_name, err in verdict["rel_err"].items():
                if err is not None:
                    err = err if err == err else math.inf  # NaN compares false with everything; inf sorts last
                    row["rel_err"] = err if row["rel_err"] is None else max(row["rel_err"], err)
                    cand_by[out_name] = max(cand_by.get(out_name, 0.0), err)
            if not verdict["ok"]:
                row.update(correct=False, problem=f"seed {seed}: {verdict['problem']}")
                return None
            if reply.get("ops"):
                row.update(forbidden=reply["ops_message"], ops=reply["ops"])
                return None
            pool.append({"inputs": inputs, "expected": expected})
            del outs
        self.kept[key]["dtypes"] = dtypes
        row["correct"] = True
        row["rel_err_by_output"], row["baseline_rel_err_by_output"] = cand_by, base_by
        self._precision(row, shape["name"], dict(zip(names, tols)))
        return None

    def _specs(self, expected: list[Any], dtypes: list[Any]) -> list[dict[str, Any]]:
        return [{"shape": list(t.shape), "dtype": str(d).removeprefix("torch.")} for t, d in zip(expected, dtypes)]

    def _precision(self, row: dict[str, Any], name: str, tols: dict[str, float]) -> None:
        """Compare the candidate's error with the baseline's on the same inputs, output by output, each against its
        own tolerance (HARNESS.md L2)."""
        from workbench.evaluator.verdict import PRECISION_RATIO, PRECISION_TOL_FRACTION

        cand_by, base_by = row.get("rel_err_by_output") or {}, row.get("baseline_rel_err_by_output") or {}
        ratios = {}
        for out, tol in tols.items():
            cand, base = cand_by.get(out), base_by.get(out)
            if base is not None and base > 0.8 * tol:
                self.warnings.append(f"{name}: the baseline's own error on {out}, {base:.2g}, is above 0.8x its "
                                     f"tolerance {tol:.2g}")
            if cand is None or base is None:
                continue
            ratios[out] = cand / base if base > 0 else (math.inf if cand > 0 else 1.0)
            if ratios[out] > PRECISION_RATIO and cand > PRECISION_TOL_FRACTION * tol:
                row["precision_flag"] = True
                self.warnings.append(f"{name}: candidate error on {out}, {cand:.2g}, is {ratios[out]:.3g}x the "
                                     f"baseline's {base:.2g} (lower precision than the baseline?)")
        if ratios:
            row["err_ratio"] = max(ratios.values())

    # -- timing --------------------------------------------------------------------------------------------------

    def _plan(self, n: int, sets: int, previous: int | None) -> list[int]:
        """Input sets for n reps: random, never the same set twice in a row (a result cache then always misses)."""
        plan: list[int] = []
        last = previous
        for _ in range(n):
            choices = [i for i in range(sets) if i != last] or [0]
            last = self.rng.choice(choices)
            plan.append(last)
        return plan

    def _spot(self, kept: dict[str, Any], plan: list[int], spots: list[dict[str, Any]], seed: int) -> str | None:
        """Compare kept outputs of timed reps with the expected outputs of the input set each rep used."""
        from workbench.evaluator import checks, inputs as inputs_mod

        torch = self.torch
        for spot in spots:
            rep = int(spot["rep"])
            expected = kept["sets"][plan[rep]]["expected"]
            values = spot["outputs"]
            if len(values) != len(expected):
                return f"timed call {rep} returned {len(values)} value(s), expected {len(expected)}"
            for j, (got, ref) in enumerate(zip(values, expected)):
                name = self.cfg["outputs"][j]
                if not isinstance(got, torch.Tensor):
                    return f"timed call {rep}: output {name} is not a torch.Tensor"
                flat = ref.reshape(-1)
                idx = inputs_mod.subset_index(flat.numel(), seed + j).to(flat.device)
                want = flat[idx]
                if got.shape != want.shape:
                    return f"timed call {rep}: output {name} has {got.numel()} checked values, expected {want.numel()}"
                bad = int((~torch.isfinite(got)).sum()) if got.is_floating_point() else 0
                err = checks.rel_rms(want, got) if want.numel() else 0.0
                if bad or not err <= self.cfg["tols"][j]:
                    why = f"{bad} NaN/inf" if bad else f"rel_rms {err:.3g} > tol {self.cfg['tols'][j]:.3g}"
                    return (f"spot check of timed call {rep} failed on output {name} ({why}): timed calls must "
                            "compute the result for their own inputs (no caching, deferral or drift)")
        return None

    def time_shape(self, row: dict[str, Any], key: int, order: int) -> dict[str, Any] | None:
        """Warm up both sides, then alternate blocks of baseline and candidate reps; spot-check and re-validate."""
        from workbench.evaluator import checks, inputs as inputs_mod, timing

        kept = self.kept[key]
        sets = kept["sets"]
        base_buf = inputs_mod.clone(sets[0]["inputs"])
        cuda = self.device == "cuda"
        if cuda:
            warm_n = self.rng.randint(3, 8)  # random, so warm-up and measurement look alike (HARNESS.md T4)
            self.progress("warmup", "time", group=row["group"], shape=row["name"])
            reply = self.ask({"op": "warmup", "key": key, "n": warm_n})
            if not reply["ok"]:
                return reply
            est = max(float(reply["ms"]), self.timer.warmup(self.baseline_fn, base_buf, warm_n))
        else:
            est = 0.0  # the interpreter was warmed by the correctness calls and gets a fixed rep count
        reps = timing.plan_reps(est, self.device)
        blocks = min(self.cfg["blocks"], reps) if cuda else reps
        per_block = max(1, math.ceil(reps / blocks))
        cand_ms: list[float] = []
        cand_wall: list[float] = []
        base_ms: list[float] = []
        base_wall: list[float] = []
        checked = 0
        sides = ["candidate", "baseline"] if order % 2 == 0 else ["baseline", "candidate"]
        self.progress("timing", "time", group=row["group"], shape=row["name"])
        previous: int | None = None
        problem = None
        after = 0
        for _ in range(blocks):
            plan = self._plan(per_block, len(sets), previous)
            previous = plan[-1]
            after = self._plan(1, len(sets), plan[-1])[0] if cuda else plan[-1]
            for side in sides:
                if side == "candidate":
                    check = [self.rng.randrange(per_block)]
                    subset_seed = self.rng.randrange(1 << 30)
                    reply = self.ask({"op": "time", "key": key, "plan": plan, "check": check,
                                      "subset_seed": subset_seed, "after": after})
                    if not reply["ok"]:
                        return reply
                    cand_ms += [float(x) for x in reply["ms"]]
                    cand_wall += [float(x) for x in reply["wall"]]
                    problem = problem or self._spot(kept, plan, self.tensors(reply["spots"]), subset_seed)
                    checked += len(check)
                else:
                    def refill(i: int, plan: list[int] = plan) -> None:
                        inputs_mod.refill(base_buf, sets[plan[i]]["inputs"])

                    ms, _ = self.timer.block(self.baseline_fn, base_buf, per_block, refill=refill)
                    base_ms += ms
                    if cuda:
                        wall, _ = self.timer.isolated(
                            self.baseline_fn, base_buf, refill=lambda i: inputs_mod.refill(base_buf, sets[after]["inputs"]))
                        base_wall.append(wall)
                    else:
                        base_wall += ms
        self.progress("revalidate", "call", group=row["group"], shape=row["name"])
        reply = self.ask({"op": "output", "key": key})
        if not reply["ok"]:
            return reply
        outs = self.tensors(reply["outputs"])
        ref = sets[int(reply.get("set", after))]["expected"]
        verdict = checks.compare(outs, reply["meta"], ref, kept["dtypes"], self.cfg["outputs"], self.cfg["tols"],
                                 self.device)
        if reply.get("mutated"):
            problem = problem or f"forward modified its input(s) {', '.join(map(str, reply['mutated']))} during timing"
        elif not verdict["ok"]:
            problem = problem or f"after the timing loop: {verdict['problem']}"
        c, b = timing.summarize(cand_ms), timing.summarize(base_ms)
        row.update(
            ms=c["median"], ms_iqr=c["iqr"], ms_min=c["min"],
            baseline_ms=b["median"], baseline_ms_iqr=b["iqr"],
            wall_ms=timing.summarize(cand_wall)["median"], baseline_wall_ms=timing.summarize(base_wall)["median"],
            reps=len(cand_ms), revalidated=problem is None, spot_checks=checked,
        )
        if problem:
            row.update(correct=False, problem=problem)
            return None
        if cuda and self.cfg.get("graph"):
            return self.time_graph(row, key, sides, max(GRAPH_MIN_REPS, len(cand_ms) // 2), blocks)
        return None

    def time_graph(self, row: dict[str, Any], key: int, sides: list[str], reps: int,
                   blocks: int) -> dict[str, Any] | None:
        """CUDA-graph timing of both sides, interleaved in blocks like the event timing (task option / --graph).

        Each side's forward is captured once on its timing buffers and replayed with fresh inputs and a flush
        before every rep. The candidate's last replay is spot-checked; a side that cannot be captured, or whose
        replay is wrong, gets no graph figure and a warning (the event timing stands on its own).
        """
        from workbench.evaluator import inputs as inputs_mod, timing

        kept = self.kept[key]
        sets = kept["sets"]
        self.progress("graph", "time", group=row["group"], shape=row["name"])
        base_buf = inputs_mod.clone(sets[0]["inputs"])
        try:
            self.timer.warmup(self.baseline_fn, base_buf, 1)
            base_graph, _ = self.timer.capture(self.baseline_fn, base_buf)
        except Exception as exc:  # noqa: BLE001 - reported, the event timing stands
            self.torch.cuda.synchronize()
            base_graph = None
            row["baseline_graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
        per_block = max(1, math.ceil(reps / blocks))
        cand: list[float] = []
        base: list[float] = []
        previous: int | None = None
        for _ in range(blocks):
            plan = self._plan(per_block, len(sets), previous)
            previous = plan[-1]
            for side in sides:
                if side == "candidate" and "graph_error" not in row:
                    seed = self.rng.randrange(1 << 30)
                    reply = self.ask({"op": "graph", "key": key, "plan": plan, "subset_seed": seed})
                    if not reply["ok"]:
                        return reply
                    if "graph_error" in reply:
                        row["graph_error"] = reply["graph_error"]
                        continue
                    wrong = self._spot(kept, plan, self.tensors(reply["spots"]), seed)
                    if wrong:
                        row["graph_error"] = f"graph replay: {wrong}"
                        continue
                    cand += [float(x) for x in reply["ms"]]
                elif side == "baseline" and base_graph is not None:
                    def refill(i: int, plan: list[int] = plan) -> None:
                        inputs_mod.refill(base_buf, sets[plan[i]]["inputs"])

                    base += self.timer.graph_block(base_graph, per_block, refill=refill)
        for name, error, ms in (("graph_ms", "graph_error", cand), ("baseline_graph_ms", "baseline_graph_error", base)):
            if ms and not row.get(error):
                stats = timing.summarize(ms)
                row[name], row[name + "_iqr"] = stats["median"], stats["iqr"]
        for name in ("graph_error", "baseline_graph_error"):
            if row.get(name):
                side = "candidate" if name == "graph_error" else "baseline"
                self.warnings.append(f"{row['name']}: no CUDA-graph time for the {side}: {row[name]}")
        return None

    # -- profile -------------------------------------------------------------------------------------------------

    def profile(self, rows: list[dict[str, Any]], keys: dict[str, int]) -> dict[str, Any] | None:
        """Record a few calls per shape with torch.profiler, candidate and baseline, each side in one session.

        Gives the kernel table, the provenance check (only the candidate's Triton kernels, on the caller's stream)
        and an independent timer (the kernel sum per call) to hold against the CUDA-event median.
        """
        from workbench.evaluator import inputs as inputs_mod
        from workbench.profiler import capture, kernels

        self.launch_overhead_ms = self._launch_overhead()
        plans = {row["name"]: self._plan(PROFILE_CALLS, len(self.kept[keys[row["name"]]]["sets"]), None)
                 for row in rows}
        calls = [(keys[row["name"]], i) for row in rows for i in plans[row["name"]]]
        self.progress("profile", "time", group=rows[0]["group"], shape=rows[0]["name"])
        reply = self.ask({"op": "profile", "calls": calls})
        if not reply["ok"]:
            return reply
        windows = kernels.attribute(reply["events"])
        self.compile_stats = list(reply.get("compile", []))
        jobs = []
        for row in rows:
            sets = self.kept[keys[row["name"]]]["sets"]
            buf = inputs_mod.clone(sets[0]["inputs"])
            for i in plans[row["name"]][:BASELINE_PROFILE_CALLS]:
                def prepare(buf: dict[str, Any] = buf, src: dict[str, Any] = sets[i]["inputs"]) -> None:
                    inputs_mod.refill(buf, src)
                    self.timer.flush()

                jobs.append((self.baseline_fn, buf, prepare))
        base_windows = kernels.attribute(capture.capture(jobs)) if self.cfg.get("profile_baseline", True) else []
        for n, row in enumerate(rows):
            mine = windows[n * PROFILE_CALLS:(n + 1) * PROFILE_CALLS]
            self._judge_profile(row, mine)
            if base_windows:
                theirs = base_windows[n * BASELINE_PROFILE_CALLS:(n + 1) * BASELINE_PROFILE_CALLS]
                row["profile"]["baseline_kernels"] = kernels.kernel_table(theirs)
        return None

    def _launch_overhead(self) -> float | None:
        """The flushed event window of a one-element kernel minus that kernel's own (profiled) duration, in ms.

        This is the fixed cost of a timed window (front-end launch, completion, event records; about 3 us on the
        H200), which kernel durations exclude: it separates an honest gap between the two timers from work that
        escaped one of them.
        """
        import statistics

        from workbench.profiler import capture, kernels

        floor = getattr(self.timer, "floors", {}).get("tiny_kernel_window_ms")
        if floor is None:
            return None
        tiny = self.torch.zeros(1, dtype=self.torch.int32, device="cuda")
        jobs = [(lambda t=tiny: t.zero_(), {}, self.timer.flush) for _ in range(TINY_CALLS)]
        sums = [ms for ms in kernels.per_call_ms(kernels.attribute(capture.capture(jobs))) if ms > 0]
        return max(0.0, floor - statistics.median(sums)) if sums else None

    def _judge_profile(self, row: dict[str, Any], calls: list[list[dict[str, Any]]]) -> None:
        from workbench.profiler import kernels

        sums = kernels.per_call_ms(calls)
        kernel_ms = sorted(sums)[len(sums) // 2] if sums else None
        row["profile"] = {"calls": len(calls), "kernel_ms": kernel_ms, "kernels": kernels.kernel_table(calls)}
        problems = kernels.provenance(calls, self.cfg["jit_names"])
        if problems and "forbidden" not in row:
            row["forbidden"] = f"{self.cfg['display']}: {problems[0]}"
        ms = row.get("ms")
        if not (kernel_ms and ms):
            return
        ratio = ms / kernel_ms
        row["profile"]["event_vs_kernel"] = ratio
        row["profile"]["event_overhead_us"] = (ms - kernel_ms) * 1e3
        overhead = getattr(self, "launch_overhead_ms", None)
        if overhead is not None:
            # What every event window holds beyond kernel durations, measured apart: with it taken off, the two
            # timers should agree whatever the kernel's length.
            row["profile"]["launch_overhead_us"] = overhead * 1e3
            row["profile"]["event_net_vs_kernel"] = (ms - overhead) / kernel_ms
        if ratio < ESCAPE_RATIO and "forbidden" not in row:
            row["forbidden"] = (f"{self.cfg['display']}: the timed window saw {ms:.4g} ms but the profiler saw "
                                f"{kernel_ms:.4g} ms of GPU work per call: work escaped the timed window")
        else:
            net = ms - (overhead or 0.0)
            if abs(net / kernel_ms - 1) > AGREEMENT_WARN and abs(net - kernel_ms) * 1e3 > AGREEMENT_WARN_US:
                self.warnings.append(f"{row['name']}: CUDA-event median {ms:.4g} ms (less {1e3 * (overhead or 0):.1f} "
                                     f"us of window overhead) and profiler kernel sum {kernel_ms:.4g} ms differ by "
                                     f"{100 * abs(net / kernel_ms - 1):.0f}%")

    # -- main ----------------------------------------------------------------------------------------------------

    def run(self) -> None:
        if not self.setup():
            return
        self.kept: dict[Any, Any] = {}
        self.compile_stats: list[dict[str, Any]] = []
        self.progress("load", "load")
        reply = self.ask({"op": "load"})
        rows: list[dict[str, Any]] = []
        if not reply["ok"]:
            self.finish(rows, reply)
            return
        self.generate = bool(reply.get("generate"))
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
                if row.get("forbidden"):
                    self.finish(rows, None)
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
                if failure or row.get("correct") is False:
                    break
            if not failure and self.device == "cuda" and rows and all(r.get("correct") for r in rows):
                failure = self.profile(rows, keys)
        finally:
            if sampler is not None:
                self.clocks_during = sampler.stop()
        self.finish(rows, failure)

    def finish(self, rows: list[dict[str, Any]], failure: dict[str, Any] | None) -> None:
        """Send the final measurements; a worker failure (compile error, crash, forbidden) rides along."""
        from workbench.evaluator import envinfo, timing

        if failure is not None:
            failure = {"verdict": failure.get("verdict", "crash"), "message": str(failure.get("message", ""))[:2000],
                       "stage": dict(self.stage)}
        thread = getattr(self, "_env_thread", None)
        if thread is not None:
            thread.join(timeout=30)
        env = dict(self.env)
        during = getattr(self, "clocks_during", None)
        if during is not None:
            env["clocks_during"] = during
            reason = envinfo.throttled(during)
            if reason:
                self.warnings.append(f"GPU clocks were throttled during timing (reasons {reason})")
        moved = sum(getattr(self, name).bytes_moved for name in ("slab_in", "slab_out") if hasattr(self, name))
        self.tell({
            "type": "result",
            "failure": failure,
            "rows": rows,
            "env": env,
            "baseline": getattr(self, "baseline_name", None),
            "compile": getattr(self, "compile_stats", []),
            "timing": {
                "method": "cuda events around each call; before each rep the inputs are refilled with another seed's "
                          "values and L2 is flushed, outside the window; reps enqueued back to back, device-wide "
                          "sync per block; interleaved A/B blocks; one isolated host-timed call per block"
                if self.device == "cuda" else "host perf_counter (Triton interpreter), not comparable",
                "flush_mb": timing.FLUSH_BYTES >> 20 if self.device == "cuda" else 0,
                "flush_ms": getattr(getattr(self, "timer", None), "flush_ms", None),
                **getattr(getattr(self, "timer", None), "floors", {}),
                "blocks": self.cfg["blocks"] if self.device == "cuda" else 1,
                "inputs": "generated in both processes, fingerprint-checked" if self.generate else "sent via slab",
                "slab_mb": round(moved / 2**20, 1),
            },
            "warnings": self.warnings,
        })
        try:
            from workbench.evaluator import wire

            wire.write_frame(self.cfg["fd_worker_out"], wire.dump_json({"op": "exit"}))
        except OSError:
            pass


def _preload(device: str) -> None:
    """What every evaluation on `device` needs, done before the configuration arrives (see prestart)."""
    import torch

    from workbench.evaluator import checks, envinfo, inputs, slab, timing, wire  # noqa: F401

    if device == "cuda" and torch.cuda.is_available():
        torch.cuda.init()


def main() -> int:
    """Entry point: preload for the device named on the command line, read the config from stdin, run, and
    report any failure of our own as harness_error."""
    faulthandler.enable()
    if len(sys.argv) != 2:
        print("usage: python -m workbench.evaluator.harness DEVICE  (configuration as JSON on stdin)", file=sys.stderr)
        return 2
    _preload(sys.argv[1])
    text = sys.stdin.read()
    if not text.strip():
        return 0  # a pre-started pair that was never used
    cfg = json.loads(text)
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
