"""Compile a baseline's autotuning configs ahead, in parallel processes, when a machine has never run it.

A library baseline such as FLA autotunes on its first call for each new key (KDA: each head count), and on a
fresh machine most of that is compiling every config, one after another (about 65 s per head count on the H200).
Run as ``python -m workbench.evaluator.precompile`` (configuration as JSON on stdin), one process per shape, all at
once: each calls the baseline once with Triton's benchmark replaced by a single launch, so every config is compiled
into the machine's Triton cache, and no autotuning choice is kept (FLA_CACHE_RESULTS=0, Triton's autotune cache
off). The service's own warm-up then autotunes for real, one shape at a time on a quiet GPU, with every compile a
cache hit. Only trusted code runs here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, TypedDict

ENV = {"FLA_CACHE_RESULTS": "0", "TRITON_CACHE_AUTOTUNING": "0"}
"""Keep no autotuning choice made with the stand-in benchmark (FLA passes cache_results from FLA_CACHE_RESULTS)."""
MARKER = "workbench-precompiled-{}"
"""Left in the trusted Triton cache once a baseline's configs are compiled there (by task hash)."""


class _CompileOnly:
    """The autotuner's benchmark, replaced: the share-th of every `shares` configs is launched once (which compiles
    it) and reported at a constant time; the others are skipped as if they did not fit, so several processes split
    one shape's configs between them. The autotuner then launches the best one, compiled by construction."""

    def __init__(self, share: int, shares: int):
        self.share, self.shares = share, shares
        self.calls = 0

    def __call__(self, kernel_call: Any, quantiles: Any = None, **_: Any) -> Any:
        import torch

        mine = self.calls % self.shares == self.share
        self.calls += 1
        if mine:
            kernel_call()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        value = 1.0 if mine else float("inf")
        return [value] * 3 if quantiles is not None else value


def marker_path(task_hash: str) -> Path:
    """Where this machine records that a task's baseline was precompiled (beside Triton's own cache)."""
    from triton import knobs

    return Path(knobs.cache.dir) / MARKER.format(task_hash[:16])


def spawn(cfg: dict[str, Any], shapes: list[dict[str, Any]], replayed: bool = False) -> list[subprocess.Popen]:
    """Precompile processes for every shape, the CPUs shared out: each shape's configs split over as many
    processes as there are CPUs for it (trusted environment, Triton's cache shared with the service). With the
    baseline's recorded choices replayed (tuned.py) a shape compiles only its chosen configs: one process each."""
    from workbench.evaluator import isolation, tether

    env = {**isolation.trusted_env(), **ENV, "PYTHONUNBUFFERED": "1"}
    shares = 1 if replayed else max(1, (len(os.sched_getaffinity(0)) - 2) // max(1, len(shapes)))
    procs = []
    for params in shapes:
        for share in range(shares):
            proc = subprocess.Popen(tether.python_argv("workbench.evaluator.precompile"), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
            job = {**cfg, "params": params, "share": share, "shares": shares}
            proc.stdin.write(json.dumps(job).encode())  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
            procs.append(proc)
    return procs


class Precompiled(TypedDict):
    """What one precompile took: its processes, how many finished cleanly, and the wall time."""

    shapes: int
    """Processes (one or more per shape)."""
    ok: int
    s: float


def run(cfg: dict[str, Any], shapes: list[dict[str, Any]], replayed: bool = False,
        announce: Callable[[int], None] | None = None) -> Precompiled:
    """Spawn the precompile processes (spawn) and wait for them within the trusted side's baseline limit; one that
    runs past it is killed (the warm-up then compiles what it left). announce(processes) is called once they run."""
    from workbench.evaluator import limits

    started = time.monotonic()
    procs = spawn(cfg, shapes, replayed=replayed)
    if announce is not None:
        announce(len(procs))
    ok = 0
    for proc in procs:
        try:
            ok += proc.wait(timeout=max(1.0, started + limits.TRUSTED_S["baseline"] - time.monotonic())) == 0
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"shapes": len(procs), "ok": ok, "s": round(time.monotonic() - started, 3)}


def main() -> int:
    """Compile one shape's baseline configs; print what it took as one JSON line."""
    cfg = json.loads(sys.stdin.read())
    import torch
    import triton.testing

    from workbench.evaluator import tuned
    from workbench.evaluator.loading import import_file

    # Triton's CUDA driver fetches its benchmarker from here whenever an autotuner first benchmarks.
    triton.testing.do_bench = _CompileOnly(int(cfg.get("share", 0)), int(cfg.get("shares", 1)))
    sys.path.insert(0, cfg["task_dir"])
    started = time.perf_counter()
    reference = import_file(cfg["reference"], "workbench_task_reference")
    before = set(sys.modules)
    baseline = import_file(cfg["baseline"], "workbench_task_baseline")
    if not baseline.available():
        print(json.dumps({"skipped": "baseline unavailable"}))
        return 0
    replay = tuned.replay(cfg["task_dir"], torch.cuda.get_device_name(), sorted(set(sys.modules) - before))
    inputs = reference.make_inputs(dict(cfg["params"]), 0, "cuda")
    baseline.forward(**inputs)
    torch.cuda.synchronize()
    print(json.dumps({"s": round(time.perf_counter() - started, 3), "pid": os.getpid(), "tuned": replay["applied"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
