"""Compile the Gluon MLA stage 1 for sm_90 without a GPU and report its structure as JSON.

Triton's wheel carries ptxas and cuobjdump, so the whole Hopper pipeline (Gluon -> TTGIR -> PTX -> cubin) runs on
a CPU-only machine. That catches compile errors before a GPU lease, and it pins the kernel's shape: shared memory,
the tensor-core instructions per tile, TMA copies, register budgets and spills. The test suite runs this in a
process of its own, since a process that imported Triton under TRITON_INTERPRET=1 holds interpreted versions of
Triton's own jit helpers (tl.max, tl.cdiv) that Gluon cannot compile.

Run: PYTHONPATH=. python benchmarks/mla_compile_check.py [--splits 4] [--dump DIR]
"""

import argparse
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
                   kernel_file: Path = KERNEL, store: str = ""):
    """The stage-1 kernel compiled for sm_90 with the descriptors and arguments its launcher builds at B=2, H=64;
    `fused` compiles the variant that merges its splits itself, block_n/stages another tile ring (0: CONFIG's),
    kernel_file a patched copy of the kernel (benchmarks/mla_trace.py's), store how o is written ("lsu" or "tma";
    empty: CONFIG's)."""
    ours = _module(kernel_file)
    kernel = ours._mla_split_attend_ws
    cfg = ours.CONFIG
    tma_store = (store or cfg["STORE"]) == "tma"
    batch, heads, n = 2, 64, 256
    block, stages = block_n or cfg["BLOCK_N"], stages or cfg["num_stages"]
    q = torch.zeros(batch * heads, 576, dtype=torch.bfloat16)
    kv = torch.zeros(batch * n, 576, dtype=torch.bfloat16)

    def desc(t, rows, cols):
        return ours.GluonDescriptor.from_tensor(t, [rows, cols], ours._smem_layout(rows, cols))

    out = torch.zeros(batch * heads * splits, 512, dtype=torch.bfloat16)
    lse = torch.zeros(batch * heads * splits)
    final = torch.zeros(batch, heads, 512, dtype=torch.bfloat16)
    s_pad, upi, wu = ours.merge_tile(splits)
    o_desc = desc(out.view(batch * heads, splits * 512), 64, 64) if tma_store else desc(q, 64, 512)
    args = (desc(q, 64, 512), desc(q, 64, 64), desc(kv, block, 512), desc(kv, block, 64), o_desc,
            torch.zeros(batch, dtype=torch.int32), out, lse, n // splits, heads, n, 0.1,
            heads * splits * 512, splits * 512, 512, heads * splits, splits, 1,
            torch.zeros(8, dtype=torch.int32), final, torch.zeros(batch, heads), heads * 512, 512, splits)
    consts = dict(BLOCK_N=block, BLOCK_H=64, STAGES=stages, SINGLE=False,
                  CONSUMER_REGS=ours.GLUON_CONSUMER_REGS, FUSED=fused, S_PAD=s_pad, UPI=upi,
                  MERGE_WU=wu, PDL=pdl, TMA_STORE=tma_store)
    options = dict(num_warps=4, maxnreg=ours.GLUON_MAXNREG)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, parsed = binder(*args, **consts, **options)
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
    parser.add_argument("--kernel", type=Path, default=KERNEL, help="a copy of the kernel module to compile")
    parser.add_argument("--dump", help="also write the kernel's ttgir and ptx into this folder")
    args = parser.parse_args()
    if triton.knobs.runtime.interpret:
        print("mla_compile_check: unset TRITON_INTERPRET (Gluon does not compile under the interpreter)",
              file=sys.stderr)
        return 2
    compiled = compile_stage1(args.splits, args.fused, args.block_n, args.stages, args.pdl, args.kernel, args.store)
    if args.dump:
        folder = Path(args.dump)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "mla_stage1.ttgir").write_text(compiled.asm["ttgir"])
        (folder / "mla_stage1.ptx").write_text(compiled.asm["ptx"])
    print(json.dumps(report(compiled)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
