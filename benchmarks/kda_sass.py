"""kda_chunked's kernels compiled for sm_90 on a machine without a GPU: registers, spills, shared memory, SASS loops.

Triton compiles for a named target without a device, and ships ptxas and cuobjdump, so a variant's resources and
the size of its K-slice loop can be read before a device lease. Pointers are marked 16-byte aligned as at launch
(without that, loads are not vectorised and the counts mislead).

    PYTHONPATH=. python benchmarks/kda_sass.py [--kernel PATH] [key=val,... ...]

Prints one line per configuration (kda_chunked CONFIG overrides; none: CONFIG) and kernel: registers, stack
bytes (spills), shared memory, static SASS instructions, HGMMA and local-memory traffic, then each backward-branch
loop with its instruction count and commonest opcodes.
"""

import argparse
import importlib.util
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

ROOT = Path(__file__).resolve().parents[1]
TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
PREP_ARGS = ("q:*bf16 k:*bf16 v:*bf16 g:*fp32 beta:*bf16 w:*bf16 u:*bf16 mbuf:*bf16 qg:*bf16 kg:*bf16 aqk:*bf16 "
             "aqk_lo:*bf16 gc:*fp32 lbuf:*fp32 flag:*i32 T:i32 NT:i32 scale:fp32 H:i32")
WY_ARGS = "v:*bf16 beta:*bf16 w:*bf16 u:*bf16 mbuf:*bf16 lbuf:*fp32 T:i32 NT:i32 H:i32"
SCAN_ARGS = ("w:*bf16 u:*bf16 v:*bf16 mbuf:*bf16 qg:*bf16 kg:*bf16 aqk:*bf16 aqk_lo:*bf16 gc:*fp32 h0:*fp32 o:*bf16 "
             "ht:*fp32 T:i32 NT:i32 H:i32")


def compile_kernel(fn, args, const, opts):
    """(cubin bytes, shared memory) of fn for sm_90 with K = V = 128; arguments fn does not take are dropped, so
    earlier copies of the kernel compile too."""
    sig = {name: ty for name, ty in (item.split(":") for item in args.split()) if name in fn.arg_names}
    const = {name: val for name, val in const.items() if name in fn.arg_names}
    sig.update({name: "constexpr" for name in const})
    sig = {name: sig[name] for name in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, ty in enumerate(sig.values()) if ty.startswith("*")}
    names = list(sig)
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()}, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 128), options=opts)
    return kernel.asm["cubin"], kernel.metadata.shared


def describe(cubin, shared):
    """One summary line and the loops of a cubin's SASS."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(cubin)
    try:
        res = subprocess.run([TOOLS / "cuobjdump", "-res-usage", fh.name], capture_output=True, text=True).stdout
        sass = subprocess.run([TOOLS / "cuobjdump", "-sass", fh.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(fh.name)
    usage = re.search(r"REG:(\d+) STACK:(\d+)", res)
    ins = [(int(m.group(1), 16), m.group(2)) for m in
           (re.match(r"\s+/\*([0-9a-f]{4,6})\*/\s+(.*?);", line) for line in sass.splitlines()) if m]
    text = " ".join(t for _, t in ins)
    head = (f"regs {usage.group(1)} stack {usage.group(2)} B smem {shared // 1024} KB ins {len(ins)} "
            f"hgmma {text.count('HGMMA')} STL {text.count('STL')} LDL {text.count('LDL')}")
    where = {addr: i for i, (addr, _) in enumerate(ins)}
    loops = []
    for i, (addr, t) in enumerate(ins):
        target = re.search(r"BRA\s.*?0x([0-9a-f]+)", t)
        if target and int(target.group(1), 16) < addr and int(target.group(1), 16) in where:
            body = ins[where[int(target.group(1), 16)]:i + 1]
            ops = {}
            for _, op in body:
                name = op.split()[1] if op.startswith("@") else op.split()[0]
                ops[name.split(".")[0]] = ops.get(name.split(".")[0], 0) + 1
            top = ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
            loops.append(f"    loop of {len(body)} instructions: {top}")
    return head, loops


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", default=str(ROOT / "kernels" / "kda" / "kda_chunked.py"))
    ap.add_argument("configs", nargs="*", help="key=val,... overrides of CONFIG, one configuration each")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("kda_chunked_sass", args.kernel)
    kc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kc)
    for text in args.configs or [""]:
        cfg = dict({"aqk_ops": 0, "aqk_lo": 0, "far_split": 0, "prep_split": 0, "prep_order": 0, "prep_nreg": 0,
                    "wy_warps": 4}, **kc.CONFIG)
        cfg.update({k: int(v) for k, v in (item.split("=") for item in filter(None, text.split(",")))})
        prep_const = {"K": 128, "V": 128, "BK": cfg["BK"], "BW": 64, "BVP": cfg["BVP"], "AQK_OPS": cfg["aqk_ops"],
                      "AQK_LO": cfg["aqk_lo"], "WY": int(not cfg["prep_split"]), "ORDER": cfg["prep_order"],
                      "FAR": 0 if cfg["far_split"] else cfg.get("far_stages", 1), "FLAGGED": 0,
                      "M_SCAN": cfg.get("m_scan", 0), "INV_MEM": cfg.get("inv_mem", 0)}
        prep_opts = {"num_warps": cfg["prep_warps"], "num_stages": cfg["prep_stages"]}
        kernels = [("prep", kc._kda_prep, PREP_ARGS, prep_const,
                    dict(prep_opts, **({"maxnreg": cfg["prep_nreg"]} if cfg["prep_nreg"] else {})))]
        if cfg["far_split"]:
            far_const = dict(prep_const, FAR=cfg.get("far_stages", 1), FLAGGED=1)
            kernels.append(("prep_far", kc._kda_prep, PREP_ARGS, far_const, prep_opts))
        if cfg["prep_split"]:
            kernels.append(("wy", kc._kda_wy, WY_ARGS, {"K": 128, "V": 128, "BW": 64, "BVP": cfg["BVP"],
                                                        "ORDER": cfg["prep_order"],
                                                        "M_SCAN": prep_const["M_SCAN"],
                                                        "INV_MEM": cfg.get("inv_mem", 0)},
                            dict(prep_opts, num_warps=cfg["wy_warps"])))
        kernels.append(("scan", kc._kda_scan, SCAN_ARGS,
                        {"K": 128, "V": 128, "BV": cfg["BV"] or 64, "HAS_H0": True, "AQK_LO": cfg["aqk_lo"],
                         "M_SCAN": cfg.get("m_scan", 0)},
                        {"num_warps": cfg["scan_warps"], "num_stages": cfg["scan_stages"]}))
        for name, fn, sig, const, opts in kernels:
            head, loops = describe(*compile_kernel(fn, sig, const, opts))
            print(f"{text or 'CONFIG'} {name}: {head}")
            for line in loops:
                print(line)


if __name__ == "__main__":
    main()
