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
from typing import Any

ENV = {"FLA_CACHE_RESULTS": "0", "TRITON_CACHE_AUTOTUNING": "0"}
"""Keep no autotuning choice made with the stand-in benchmark (FLA passes cache_results from FLA_CACHE_RESULTS)."""
MARKER = "workbench-precompiled-{}"
"""Left in the trusted Triton cache once a baseline's configs are compiled there (by task hash)."""


def _compile_only(kernel_call: Any, quantiles: Any = None, **_: Any) -> Any:
    """The autotuner's benchmark, replaced: one launch (which compiles), one synchronise, a constant time."""
    import torch

    kernel_call()
    torch.cuda.synchronize()
    return [1.0, 1.0, 1.0] if quantiles is not None else 1.0


def marker_path(task_hash: str) -> Path:
    """Where this machine records that a task's baseline was precompiled (beside Triton's own cache)."""
    from triton import knobs

    return Path(knobs.cache.dir) / MARKER.format(task_hash[:16])


def spawn(cfg: dict[str, Any], shapes: list[dict[str, Any]]) -> list[subprocess.Popen]:
    """One precompile process per shape (trusted environment, Triton's cache shared with the service)."""
    from workbench.evaluator import isolation

    env = {**isolation.trusted_env(), **ENV, "PYTHONUNBUFFERED": "1"}
    procs = []
    for params in shapes:
        proc = subprocess.Popen([sys.executable, "-m", "workbench.evaluator.precompile"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        proc.stdin.write(json.dumps({**cfg, "params": params}).encode())  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
        procs.append(proc)
    return procs


def main() -> int:
    """Compile one shape's baseline configs; print what it took as one JSON line."""
    cfg = json.loads(sys.stdin.read())
    import torch
    import triton.testing

    from workbench.evaluator.loading import import_file

    triton.testing.do_bench = _compile_only  # Triton's CUDA driver fetches its benchmarker from here per call
    sys.path.insert(0, cfg["task_dir"])
    started = time.perf_counter()
    reference = import_file(cfg["reference"], "workbench_task_reference")
    baseline = import_file(cfg["baseline"], "workbench_task_baseline")
    if not baseline.available():
        print(json.dumps({"skipped": "baseline unavailable"}))
        return 0
    inputs = reference.make_inputs(dict(cfg["params"]), 0, "cuda")
    baseline.forward(**inputs)
    torch.cuda.synchronize()
    print(json.dumps({"s": round(time.perf_counter() - started, 3), "pid": os.getpid()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
