"""The program ncu profiles: one shape of a candidate, warmed up, then a few calls between cudaProfilerStart/Stop.

Run as ``python -m workbench.profiler.drive --task T --file F --shape S [--calls N]``. Compilation and autotuning
happen in the warm-up, outside the profiled range, so ncu replays only the kernels of the measured calls.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Load, warm up, profile; exit 2 on a usage problem, 1 when the candidate fails."""
    parser = argparse.ArgumentParser(prog="python -m workbench.profiler.drive")
    parser.add_argument("--task", required=True)
    parser.add_argument("--file", required=True)
    parser.add_argument("--shape", required=True)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch

    from workbench.evaluator.loading import import_file
    from workbench.tasks import TaskError, load_task

    try:
        task = load_task(args.task)
        shape = task.shape(args.shape)
    except (TaskError, KeyError) as exc:
        print(f"drive: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("drive: CUDA is not available", file=sys.stderr)
        return 2
    sys.path.insert(0, str(task.dir))
    reference = import_file(task.reference, "workbench_task_reference")
    candidate = import_file(args.file, "candidate")
    forward = getattr(candidate, task.entry)
    inputs = reference.make_inputs(dict(shape.params), args.seed, "cuda")
    for _ in range(2):
        forward(**inputs)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(max(1, args.calls)):
        forward(**inputs)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
