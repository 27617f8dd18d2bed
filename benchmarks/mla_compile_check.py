"""Compile the Gluon MLA stage 1 for sm_90 without a GPU and report its structure as JSON.

Triton's wheel carries ptxas and cuobjdump, so the whole Hopper pipeline (Gluon -> TTGIR -> PTX -> cubin) runs on
a CPU-only machine. That catches compile errors before a GPU lease, and it pins the kernel's shape: shared memory,
the tensor-core instructions per tile, TMA copies, register budgets and spills. The test suite runs this in a
process of its own, since a process that imported Triton under TRITON_INTERPRET=1 holds interpreted versions of
Triton's own jit helpers (tl.max, tl.cdiv) that Gluon cannot compile.

Run: PYTHONPATH=. python benchmarks/mla_compile_check.py [--splits 4] [--dump DIR]
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import compile as triton_compile
from triton.compiler import make_backend
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import create_function_from_signature

KERNEL = Path(__file__).resolve().parent.parent / "kernels" / "mla_decode" / "mla_splitkv.py"


def _module(path: Path = KERNEL):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_stage1(splits: int = 4, fused: bool = False, block_n: int = 0, stages: int = 0, pdl: bool = False,
                   kernel_file: Path = KERNEL, store: str = "", paged: bool = False, desc: str = ""):
    """The stage-1 kernel compiled for sm_90 with the arguments its launcher builds (the module's own _gluon_args
    over cached descriptors, as a warm call passes them) at B=2, H=64; `fused` compiles the variant that merges its
    splits itself, block_n/stages another tile ring (0: CONFIG's), kernel_file a patched copy of the kernel
    (benchmarks/mla_trace.py's), store how o is written ("lsu" or "tma"; empty: CONFIG's), paged a cache of 64-row
    pages read through a block table, desc where the TMA descriptors are built ("host" or "device"; empty:
    CONFIG's)."""
    ours = _module(kernel_file)
    kernel = ours._mla_split_attend_ws
    cfg = {"STORE": store or ours.CONFIG["STORE"]}
    if "DESC" in ours.CONFIG:  # an older kernel file (--kernel) may predate it
        cfg["DESC"] = desc or ours.CONFIG["DESC"]
    if block_n:
        cfg["BLOCK_N"] = block_n
    if stages:
        cfg["num_stages"] = stages
    batch, heads, n = 2, 64, 256
    q = torch.zeros(batch, heads, 576, dtype=torch.bfloat16)
    seqlens = torch.full((batch,), n, dtype=torch.int32)
    if paged:
        kv = torch.zeros(batch * n // 64, 64, 576, dtype=torch.bfloat16)
        table = torch.arange(batch * n // 64, dtype=torch.int32).view(batch, -1)
    else:
        kv, table = torch.zeros(batch, n, 576, dtype=torch.bfloat16), None
    plan = ours._make_plan(q, kv, seqlens, table, splits, n // splits, cfg)
    # gluon_ok says no on a machine without a GPU; everything else is what a Hopper call would plan.
    plan = dataclasses.replace(plan, gluon=True, fused=fused, cached=True,
                               tma_store=plan.cfg["STORE"] == "tma" and ours.tma_store_ok(heads, 64),
                               merge_step=ours.merge_tile(splits) if fused else (1, 1, 1))
    out, lse = ours.partial_buffers(batch, heads, splits, q.device, q.dtype)
    final, final_lse = torch.zeros(batch, heads, 512, dtype=torch.bfloat16), torch.zeros(batch, heads)
    sync = torch.zeros(8, dtype=torch.int32) if fused else None
    descs = ours._descriptor_set(plan, q, kv, out)
    args = ours._gluon_args(plan, descs, seqlens, table, 0.1, out, lse, sync, final, final_lse, pdl)
    options = dict(num_warps=4, maxnreg=ours.GLUON_MAXNREG)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, parsed = binder(*args, **options)
    opts, signature, constexprs, attrs = kernel._pack_args(backend, options, bound, specialization, parsed)
    return triton_compile(GluonASTSource(kernel, signature, constexprs, attrs), target=target,
                          options=opts.__dict__)


def report(compiled) -> dict:
    """What the compiled kernel is made of, counted from its PTX and (where cuobjdump runs) its SASS."""
    ptx = compiled.asm["ptx"]
    mma = {}
    for shape in re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx):
        mma[shape] = mma.get(shape, 0) + 1
    result = {"shared_bytes": compiled.metadata.shared, "num_warps": compiled.metadata.num_warps, "wgmma": mma,
              "global_scratch_bytes": compiled.metadata.global_scratch_size,
              "tma_copies": len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
              "tma_stores": len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
              "setmaxnreg": sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
              "ptx_local_accesses": len(re.findall(r"\b(?:ld|st)\.local", ptx))}
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if tool.exists() and "cubin" in compiled.asm:
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"mla_stage1_{os.getpid()}.cubin"
        path.write_bytes(compiled.asm["cubin"])
        try:
            sass = subprocess.run([str(tool), "-sass", str(path)], capture_output=True, text=True, check=True).stdout
            res = subprocess.run([str(tool), "-res-usage", str(path)], capture_output=True, text=True).stdout
        finally:
            path.unlink(missing_ok=True)
        result["sass_spill_ops"] = len(re.findall(r"\b(?:STL|LDL)\b", sass))
        regs = re.search(r"REG:(\d+)", res)
        result["registers"] = int(regs.group(1)) if regs else None
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=4)
    parser.add_argument("--fused", action="store_true", help="the variant that merges its splits in-kernel")
    parser.add_argument("--block-n", type=int, default=0, help="tile rows (default: CONFIG's)")
    parser.add_argument("--stages", type=int, default=0, help="tile ring depth (default: CONFIG's)")
    parser.add_argument("--pdl", action="store_true", help="stage 1 releases stage 2's launch early")
    parser.add_argument("--store", choices=["lsu", "tma"], default="", help="how o is written (default: CONFIG's)")
    parser.add_argument("--paged", action="store_true", help="a cache of 64-row pages through a block table")
    parser.add_argument("--desc", choices=["host", "device"], default="",
                        help="where the TMA descriptors are built (default: CONFIG's)")
    parser.add_argument("--kernel", type=Path, default=KERNEL, help="a copy of the kernel module to compile")
    parser.add_argument("--dump", help="also write the kernel's ttgir and ptx into this folder")
    args = parser.parse_args()
    if triton.knobs.runtime.interpret:
        print("mla_compile_check: unset TRITON_INTERPRET (Gluon does not compile under the interpreter)",
              file=sys.stderr)
        return 2
    compiled = compile_stage1(args.splits, args.fused, args.block_n, args.stages, args.pdl, args.kernel, args.store,
                              args.paged, args.desc)
    if args.dump:
        folder = Path(args.dump)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "mla_stage1.ttgir").write_text(compiled.asm["ttgir"])
        (folder / "mla_stage1.ptx").write_text(compiled.asm["ptx"])
    print(json.dumps(report(compiled)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
