"""How fast one multiprocessor can write a block to L2 and read another back, with every program resident.

The fused MLA decode at B=1 ends in exactly this pattern: each program writes its partial (64 KB at M1), arrives on a
barrier, and reads a share of everyone's partials back. This probe does only that, so its times are the floor for
that tail: per program, when its stores are issued, when its own release (which waits for the stores to drain) is
done, when the last program has arrived, and when its read of another program's block is summed. Block sizes 16,
32 and 64 KB, at 128 programs (one per SM, as at M1) and at 32 (less aggregate traffic, same per-SM work).

Prints one line per case (median and max over programs, us after the first program started) and writes
$OUT/sm_traffic_probe.json.

Run (H200): PYTHONPATH=. python benchmarks/sm_traffic_probe.py
"""

import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

STAMPS = ("issued", "released", "all_arrived", "read")


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u32 $0, %globaltimer_lo;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _write_sync_read(BUF, SYNC, T, ROWS: tl.constexpr, SHIFT: tl.constexpr):
    """Write ROWS x 512 bf16, arrive (release), wait for all, read program (pid + SHIFT)'s block and sum it."""
    pid = tl.program_id(0)
    n = tl.num_programs(0)
    t0 = _now()
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, 512)[None, :]
    tl.store(BUF + pid * ROWS * 512 + r * 512 + c, (r * 512 + c + pid).to(tl.bfloat16))
    t1 = _now()
    tl.debug_barrier()
    tl.atomic_add(SYNC, 1, sem="release", scope="gpu")
    count = tl.atomic_add(SYNC, 0, sem="acquire", scope="gpu")
    t2 = _now()
    while count < n:
        count = tl.atomic_add(SYNC, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
    t3 = _now()
    src = (pid + SHIFT) % n
    x = tl.load(BUF + src * ROWS * 512 + r * 512 + c, cache_modifier=".cg")
    total = tl.sum(tl.sum(x.to(tl.float32), axis=1), axis=0)
    t4 = _now()
    tl.store(T + pid * 8 + 0, t0)
    tl.store(T + pid * 8 + 1, t1)
    tl.store(T + pid * 8 + 2, t2)
    tl.store(T + pid * 8 + 3, t3)
    tl.store(T + pid * 8 + 4, t4)
    tl.store(T + pid * 8 + 5, total.to(tl.int32))  # keeps the read alive


def measure(programs: int, rows: int, warps: int, repeats: int = 6) -> dict:
    """Stamps of the last of `repeats` launches (the first compiles), relative to the earliest program start."""
    buf = torch.empty(programs * rows * 512, dtype=torch.bfloat16, device="cuda")
    for _ in range(repeats):
        sync = torch.zeros(1, dtype=torch.int32, device="cuda")
        stamps = torch.zeros(programs * 8, dtype=torch.int32, device="cuda")
        _write_sync_read[(programs,)](buf, sync, stamps, ROWS=rows, SHIFT=37, num_warps=warps,
                                      launch_cooperative_grid=True)
    torch.cuda.synchronize()
    words = stamps.view(programs, 8)[:, :5].to(torch.int64) & 0xFFFFFFFF
    rel = ((words - words[:, 0].min()) % (1 << 32)).float() / 1000.0  # ns -> us across the 32-bit wrap
    return {name: {"median": round(float(rel[:, i + 1].median()), 2), "max": round(float(rel[:, i + 1].max()), 2)}
            for i, name in enumerate(STAMPS)}


def main() -> int:
    if not torch.cuda.is_available():
        print("sm_traffic_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    result = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "cases": {}}
    for programs in (128, 32):
        for rows in (16, 32, 64):
            key = f"{programs} programs, {rows * 512 * 2 // 1024} KB each"
            result["cases"][key] = case = measure(programs, rows, warps=8)
            print(f"{key:28s} " + "  ".join(f"{k} {v['median']:.2f}/{v['max']:.2f}" for k, v in case.items()),
                  flush=True)
    (Path(os.environ.get("OUT", ".")) / "sm_traffic_probe.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
