"""Same-run comparison for MLA decode (issue 19): our kernel against the previous kernel, the baselines (the old one,
the plain PyTorch form eager and under torch.compile) and FlashInfer's MLA decode as an anchor, on contiguous and
paged caches, under CUDA graphs and called eagerly, with the host cost of an eager call.

One device call, in two phases. Phase 1 runs at once, each in a process of its own: the correctness of every
implementation on every task shape plus bench-only paged B=1 shapes against the float64 oracle (ours also cold and
warm, with NaN past every length and in spare pages, NaN scratch at forced split counts, CUDA-graph replays including
a capture before any eager call); the torch.compile warm-up (cold compile time per shape); FlashInfer's JIT build; and
compute-sanitizer memcheck on our paged paths. Phase 2, alone on the GPU, times every implementation per shape:
CUDA-graph replays over rotated buffers and eager wall time (back-to-back calls, one sync a block) with mla_bench's
helpers, then the host time of an eager call (a loop of calls without a sync, and cProfile) at M1.

Writes $OUT/mla_compare.json; prints a table last.
Run (H200): PYTHONPATH=. python benchmarks/mla_compare.py [--before DIR] [--quick] [--skip-sanitizer]
--before DIR names a folder with the previous mla_splitkv.py and baseline.py (main's), timed as ours-main/base-main.
FlashInfer (flashinfer-python 0.5.3 with apache-tvm-ffi and nvidia-cudnn-frontend, installed with --no-deps) is an
anchor only, imported here and never by a kernel; CUDA_HOME and FLASHINFER_CUDA_ARCH_LIST=9.0a must be set for its
nvcc build.
"""

import argparse
import cProfile
import importlib.util
import io
import json
import math
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _load_path(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VARIANTS = _load_path(Path(__file__).resolve().parent / "mla_variants.py", "mla_variants")
BENCH = VARIANTS.BENCH
REF, OURS, TASK, TOL = BENCH.REF, BENCH.OURS, BENCH.TASK, BENCH.TOL
BASE = BENCH.BASE

EXTRA_SHAPES = [
    # Bench-only: the B=1 shapes paged, where our split-KV kernel merges in place (fused path) over pages.
    ("M1p64", {"B": 1, "H": 64, "N": 8192, "page_size": 64}),
    ("M1p1", {"B": 1, "H": 64, "N": 8192, "page_size": 1}),
    ("Hp2", {"B": 2, "H": 128, "N": 8193, "lengths": "ragged", "page_size": 64}),
]
TIMED = ["M1", "M2", "M3", "M4", "M5", "M6", "M1p64", "M1p1"]
OURS_ROLES = ("ours:M1,M2,M3,M4", "ours:H1,H2,H3,H4,H5", "ours:M1p64,M5,M6,H6,H7,H8,M1p1,Hp2")
"""Our correctness checks in three processes (compiles dominate); each starts fresh, so the first shape of a B=1
list is also captured into a graph before any eager call."""


def shapes() -> dict:
    """Every task shape (cuda and held-out) and the bench-only ones, by name."""
    named = {s["name"]: s["params"] for k in ("cuda", "heldout") for s in TASK["shapes"][k]}
    named.update(EXTRA_SHAPES)
    return named


# -- implementations -----------------------------------------------------------------------------------------------

def csr_pages(table: torch.Tensor, lens: torch.Tensor, page: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Our block table as FlashInfer's CSR: kv_indptr [B+1] and kv_indices (row b's used pages, in order, at
    kv_indices[kv_indptr[b]:kv_indptr[b+1]]), both int32."""
    used = (lens.long() + page - 1) // page
    live = torch.arange(table.shape[1], device=table.device)[None, :] < used[:, None]
    indptr = torch.zeros(table.shape[0] + 1, dtype=torch.int32, device=table.device)
    indptr[1:] = torch.cumsum(used, 0).to(torch.int32)
    return indptr, table[live].to(torch.int32).contiguous()


class FlashInferMLA:
    """FlashInfer's BatchMLAPagedAttentionWrapper (fa3 backend on the H200) over one input set, in its own layout:
    q_nope / q_pe and ckv / kpe caches [pages, page_size, 512 / 64] as contiguous copies, kv_indptr / kv_indices
    (CSR over each row's used pages). A contiguous cache is read as pages of 64 rows. plan() (host work and a host
    sync, once per batch composition in a serving step) happens here, outside the timed calls; lse comes back in
    natural log (return_lse_base_on_e) to compare with our oracle."""

    def __init__(self, inputs: dict, workspace: torch.Tensor):
        import flashinfer

        q, kv, lens = inputs["q"], inputs["kv_cache"], inputs["cache_seqlens"]
        table = inputs.get("block_table")
        batch, heads, _ = q.shape
        if table is None:
            n = kv.shape[1]
            page = 64 if n % 64 == 0 else 1
            kv = kv.reshape(batch * n // page, page, 576)
            table = torch.arange(batch * n // page, device=q.device, dtype=torch.int32).view(batch, -1)
        page = kv.shape[1]
        self.kv_indptr, self.kv_indices = csr_pages(table, lens, page)
        self.q_nope, self.q_pe = q[..., :512].contiguous(), q[..., 512:].contiguous()
        self.ckv, self.kpe = kv[..., :512].contiguous(), kv[..., 512:].contiguous()
        self.wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="fa3")
        qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=q.device)
        t0 = time.perf_counter()
        self.wrapper.plan(qo_indptr, self.kv_indptr, self.kv_indices, lens.to(torch.int32), heads, 512, 64, page,
                          False, inputs["sm_scale"], q.dtype, kv.dtype)
        self.plan_us = (time.perf_counter() - t0) * 1e6

    def __call__(self, **_):
        return self.wrapper.run(self.q_nope, self.q_pe, self.ckv, self.kpe, return_lse=True,
                                return_lse_base_on_e=True)


class Impl:
    """One implementation under comparison: how to call it on input sets, and which shapes it takes."""

    def __init__(self, name: str, fn, paged: bool = True, prepare=None, why: str = ""):
        self.name, self.fn, self.paged, self.why = name, fn, paged, why
        self.prepare = prepare
        """None, or input set -> a callable bound to that set (FlashInfer's per-set plan)."""

    def takes(self, params: dict) -> bool:
        return self.paged or "page_size" not in params

    def over(self, sets: list[dict]):
        """f(**inputs) for any of `sets`: the plain function, or the per-set callables found by the set's q."""
        if self.prepare is None:
            return self.fn
        bound = {id(s["q"]): self.prepare(s) for s in sets}
        fn = lambda **inputs: bound[id(inputs["q"])](**inputs)  # noqa: E731
        fn.bound = bound
        return fn


def implementations(before: Path | None, with_flashinfer: bool) -> dict:
    impls = {
        "ours": Impl("ours", OURS.forward, why="kernels/mla_decode/mla_splitkv.py, warm calls through the compiled "
                                              "kernels (LAUNCH 'cached')"),
        "ours-jit": Impl("ours-jit", lambda **kw: OURS.forward(**kw, config={"LAUNCH": "jit"}),
                         why="the same kernels launched through the JIT functions every call"),
        "ours-hostdesc": Impl("ours-hostdesc", lambda **kw: OURS.forward(**kw, config={"DESC": "host"}),
                              why="the same kernels with host-made TMA descriptors (DESC 'host'; a config per "
                                  "call adds its resolve to the host time)"),
        "plain": Impl("plain", BASE.plain, why="baseline.plain: bmm, fp32 scores, one logsumexp, exp, bmm"),
        "compile": Impl("compile", BASE.compiled, why="baseline.compiled: plain under torch.compile (default: "
                                                      "static first, dynamic sizes once a second shape comes)"),
    }
    if before is not None:
        old_ours = _load_path(before / "mla_splitkv.py", "mla_ours_before")
        old_base = _load_path(before / "baseline.py", "mla_base_before")
        impls["ours-main"] = Impl("ours-main", old_ours.forward, paged=False, why="main's kernel (before)")
        impls["base-main"] = Impl("base-main", old_base.forward, paged=False,
                                  why="main's baseline: matmul, masked softmax and logsumexp passes, matmul")
    if with_flashinfer:
        workspace = {}

        def prepare(inputs):
            device = inputs["q"].device
            buf = workspace.setdefault(device, [])
            buf.append(torch.empty(128 << 20, dtype=torch.uint8, device=device))
            return FlashInferMLA(inputs, buf[-1])

        impls["flashinfer"] = Impl("flashinfer", None, prepare=prepare,
                                   why="FlashInfer 0.5.3 BatchMLAPagedAttentionWrapper, fa3 (anchor)")
    return impls


# -- phase 1: correctness ------------------------------------------------------------------------------------------

def _poison(inputs: dict) -> None:
    """NaN wherever the contract lets the cache hold anything: rows at or past each length, and (paged) every page no
    table entry names."""
    kv, lens, table = inputs["kv_cache"], inputs["cache_seqlens"].long(), inputs.get("block_table")
    if table is None:
        rows = torch.arange(kv.shape[1], device=kv.device)[None, :] >= lens[:, None]
        kv[rows] = float("nan")
        return
    ps = kv.shape[1]
    named = torch.zeros(kv.shape[0], dtype=torch.bool, device=kv.device)
    named[table[table >= 0].long()] = True
    kv[~named] = float("nan")
    n = torch.arange(table.shape[1] * ps, device=kv.device)
    past = n[None, :] >= lens[:, None]
    pages = table[:, n // ps].long()
    hit = past & (pages >= 0)
    kv[pages[hit], (n % ps)[None, :].expand_as(pages)[hit]] = float("nan")


def _check(fn, inputs: dict, ref) -> dict:
    o, lse = fn(**inputs)
    torch.cuda.synchronize()
    e_o, e_l = BENCH.rel_rms(o, ref[0]), BENCH.rel_rms(lse, ref[1])
    return {"err_o": e_o, "err_lse": e_l, "ok": e_o <= TOL["o"] and e_l <= TOL["lse"]
            and o.dtype == inputs["q"].dtype and lse.dtype == torch.float32}


def correctness_ours(names: list[str], out_json: Path) -> list[dict]:
    """Our kernel on some shapes: a graph captured before any eager call (the fused plan's fallback, if the first
    shape has B=1), then per shape a cold and a warm call, a call over NaN tails and spare pages, a graph replay,
    and forced splits with NaN scratch. Rows go to out_json after every shape; a shape that raises is a failed row."""
    rows = []
    named = {k: v for k, v in shapes().items() if k in names}

    def add(shape, check, result):
        rows.append({"impl": "ours", "shape": shape, "check": check, **result})

    first = names[0]
    if named[first]["B"] == 1:
        inputs = REF.make_inputs(named[first], 5, "cuda")
        add(first, "graph before any call", VARIANTS._graph_check(OURS.forward, inputs, REF.forward(**inputs), first))
    for sname, params in named.items():
        try:
            _check_ours(sname, params, add)
        except Exception as exc:  # a crash at one shape is that shape's result; the rest still run
            add(sname, "raised", {"ok": False, "error": repr(exc)[:400]})
        out_json.write_text(json.dumps(rows, indent=1))
    return rows


def _check_ours(sname: str, params: dict, add) -> None:
    """correctness_ours at one shape: `add(shape, check, result)` takes each row."""
    for seed, check in ((100, "cold"), (0, "warm"), (1, "warm")):
        inputs = REF.make_inputs(params, seed, "cuda")
        add(sname, check, _check(OURS.forward, inputs, REF.forward(**inputs)))
    ref = REF.forward(**inputs)
    _poison(inputs)
    add(sname, "nan past lengths / spare pages", _check(OURS.forward, inputs, ref))
    if sname in ("M1", "M2", "M3", "M5", "M1p64", "H1", "H6", "H7", "Hp2"):
        add(sname, "graph", VARIANTS._graph_check(OURS.forward, inputs, ref, sname))
    if sname in ("H1", "H2", "H5", "H6", "H7", "Hp2"):
        for forced in (1, 4, 64, 128):
            splits, o, lse = BENCH.forced_split_run(inputs, forced)
            torch.cuda.synchronize()
            e_o, e_l = BENCH.rel_rms(o, ref[0]), BENCH.rel_rms(lse, ref[1])
            add(sname, f"forced S={splits}, NaN scratch", {"err_o": e_o, "err_lse": e_l,
                                                             "ok": e_o <= TOL["o"] and e_l <= TOL["lse"]})
    plan = OURS._PLANS.get(OURS._plan_key(inputs["q"], inputs["kv_cache"], inputs["cache_seqlens"],
                                           inputs.get("block_table"), 0, 0, None))
    if plan is not None:
        add(sname, "plan", {"ok": plan.ready, "gluon": plan.gluon, "fused": plan.fused, "splits": plan.splits,
                            "load": plan.load, "tma_store": plan.tma_store})
    del inputs, ref
    torch.cuda.empty_cache()


def correctness_others(impls: dict, names: list[str], only: list[str] | None = None) -> list[dict]:
    """The other implementations on every shape they take (compile: the timed shapes only, a compile each)."""
    rows = []
    for sname, params in shapes().items():
        if only is not None and sname not in only:
            continue
        inputs = REF.make_inputs(params, 0, "cuda")
        ref = REF.forward(**inputs)
        for name in names:
            impl = impls[name]
            if not impl.takes(params):
                continue
            try:
                rows.append({"impl": name, "shape": sname, "check": "seed 0", **_check(impl.over([inputs]), inputs,
                                                                                          ref)})
            except Exception as exc:  # an anchor that cannot run a shape is a result, not the end of the run
                rows.append({"impl": name, "shape": sname, "check": "seed 0", "ok": False, "error": repr(exc)[:300]})
        del inputs, ref
        torch.cuda.empty_cache()
    return rows


def compile_warmup() -> list[dict]:
    """Cold torch.compile cost: the first call per shape, timed shapes first, then the held-out ones in the order
    the evaluator meets them (the inductor caches on disk then serve phase 2's process)."""
    rows = []
    for sname, params in shapes().items():
        inputs = REF.make_inputs(params, 0, "cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        BASE.compiled(**inputs)
        torch.cuda.synchronize()
        rows.append({"shape": sname, "first_call_s": time.perf_counter() - t0})
        print(f"compile {sname}: {rows[-1]['first_call_s']:.1f} s", flush=True)
        t0 = time.perf_counter()
        BASE.compiled(**REF.make_inputs(params, 1, "cuda"))
        torch.cuda.synchronize()
        rows[-1]["second_call_s"] = time.perf_counter() - t0
    return rows


def sanitizer_runs(shapes_: list[str]) -> list[dict]:
    """compute-sanitizer memcheck over our kernel on a few task shapes, with workbench's driver (two warm-up calls,
    then a measured one, so the warm compiled-handle path runs under the tool too). The driver's own exit status is
    kept: the tool's summary reads 0 errors also when the program died of a Python exception."""
    from workbench.evaluator import sanitizer

    rows = []
    for shape in shapes_:
        t0 = time.time()
        cmd = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "99", sys.executable, "-m",
               "workbench.profiler.drive", "--task", "mla_decode", "--file",
               str(ROOT / "kernels" / "mla_decode" / "mla_splitkv.py"), "--shape", shape, "--calls", "2"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        row = {"shape": shape, "tool": "memcheck", "returncode": proc.returncode, "seconds": time.time() - t0,
               "command": " ".join(cmd[:6] + cmd[7:])}
        try:
            row.update(sanitizer.parse(proc.stdout + proc.stderr))
        except sanitizer.SanitizerError as exc:
            row["error"] = str(exc)
        if proc.returncode != 0:
            row["tail"] = (proc.stdout + proc.stderr)[-1500:]
        rows.append(row)
        print(f"memcheck {shape}: {row}", flush=True)
    return rows


# -- phase 2: timing -----------------------------------------------------------------------------------------------

def _host_us(fn, sets: list[dict], calls: int = 200) -> float:
    """Microseconds per call of issuing calls back to back without waiting: the host cost, while the GPU's queue
    has room (far fewer calls than its 1024 launches)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(calls):
        fn(**sets[i % len(sets)])
    host = (time.perf_counter() - t0) * 1e6 / calls
    torch.cuda.synchronize()
    return host


def _profile(fn, sets: list[dict], calls: int = 300) -> list[list]:
    """cProfile of eager calls: the top functions by own time, us per call."""
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for i in range(calls):
        fn(**sets[i % len(sets)])
    torch.cuda.synchronize()
    prof.disable()
    stream = io.StringIO()
    stats = pstats.Stats(prof, stream=stream)
    top = []
    for (file, line, func), (cc, nc, tt, ct, _) in sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:14]:
        top.append([f"{Path(file).name}:{line}({func})", nc / calls, tt * 1e6 / calls, ct * 1e6 / calls])
    total = sum(v[2] for v in stats.stats.values()) * 1e6 / calls
    return [["total own time", 1, total, total]] + top


def timing(impls: dict, names: list[str], quick: bool, rows: list, host: list, done=lambda: None) -> None:
    """Every implementation per timed shape into `rows` (graph and eager us) and, at M1 / M5 / M1p64, `host` (host
    us per call and, at M1, cProfile); `done` runs after each shape (the partial results are written out)."""
    named = shapes()
    for sname in TIMED:
        params = named[sname]
        sets = BENCH._input_sets(params, BENCH.rotation(params))
        bound, graphs, errors = {}, {}, {}
        for name in names:
            impl = impls[name]
            if not impl.takes(params) or (name == "ours-jit" and params["B"] > 1):
                continue
            try:
                bound[name] = impl.over(sets)
                graphs[name] = BENCH.graph_of(bound[name], sets)
            except Exception as exc:  # one implementation failing to capture must not cost the others their numbers
                errors[name] = repr(exc)[:300]
        times = BENCH.time_graphs(graphs, len(sets), blocks=3 if quick else 7)
        del graphs
        eager = BENCH.time_eager(bound, sets, blocks=3 if quick else 7,
                                 calls=max(len(sets), 40 if params["B"] < 8 else 8))
        _, nbytes = BENCH.roofline({"B": params["B"], "H": params["H"], "N": params["N"]})
        for name in names:
            if name not in bound and name not in errors:
                continue
            row = {"shape": sname, "impl": name, "buffers": len(sets)}
            if name in times:
                t = times[name]["median_us"]
                row.update(graph_us=t, graph_minmax=[times[name]["min_us"], times[name]["max_us"]],
                           tbps=nbytes / (t * 1e-6) / 1e12, eager_us=eager.get(name))
            else:
                row["error"] = errors.get(name, "not timed")
                if name in eager:
                    row["eager_us"] = eager[name]
            if name == "flashinfer" and name in bound:
                row["plan_us"] = [b.plan_us for b in bound[name].bound.values()]
            rows.append(row)
        if sname in ("M1", "M5", "M1p64"):
            for name, fn in bound.items():
                entry = {"shape": sname, "impl": name, "host_us": _host_us(fn, sets)}
                if sname == "M1":
                    entry["cprofile"] = _profile(fn, sets)
                host.append(entry)
        print(f"timed {sname}: " + ", ".join(f"{r['impl']} {r.get('graph_us', float('nan')):.1f}/"
                                              f"{r.get('eager_us') or float('nan'):.1f}"
                                              for r in rows if r["shape"] == sname), flush=True)
        del bound, sets
        torch.cuda.empty_cache()
        done()


# -- orchestration -------------------------------------------------------------------------------------------------

def _stem(role: str) -> str:
    """A file name for a role's outputs (the device returns only names of letters, digits, '.', '_' and '-')."""
    return role.replace(":", "_").replace(",", "-")


def _child(role: str, args) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--role", role, "--out-json", str(Path(args.tmp) / f"{_stem(role)}.json")]
    if args.quick:
        cmd.append("--quick")
    if args.before:
        cmd += ["--before", args.before]
    log = open(Path(args.tmp) / f"{_stem(role)}.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())


def run_role(args) -> int:
    before = Path(args.before) if args.before else None
    if args.role.startswith("ours:"):
        result = correctness_ours(args.role.split(":", 1)[1].split(","), Path(args.out_json))
    elif args.role == "baselines":
        impls = implementations(before, with_flashinfer=False)
        result = {"compile": compile_warmup(),
                  "correctness": correctness_others(impls, [n for n in impls if n not in ("ours", "ours-jit")])}
    elif args.role == "flashinfer":
        import flashinfer

        t0 = time.time()
        impls = implementations(None, with_flashinfer=True)
        result = {"version": flashinfer.__version__, "build_and_check": correctness_others(impls, ["flashinfer"]),
                  "seconds": time.time() - t0}
    elif args.role == "sanitizer":
        result = sanitizer_runs(["H6", "H7", "M5", "M3"])
    else:
        raise SystemExit(f"unknown role {args.role}")
    Path(args.out_json).write_text(json.dumps(result, indent=1))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="", help="folder with the previous mla_splitkv.py and baseline.py")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip-sanitizer", action="store_true")
    parser.add_argument("--no-flashinfer", action="store_true")
    parser.add_argument("--tmp", default="/tmp/mla_compare")
    parser.add_argument("--phase1-s", type=float, default=150.0, help="phase 1's deadline: later children are killed")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--out-json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("mla_compare: needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.role:
        return run_role(args)
    Path(args.tmp).mkdir(parents=True, exist_ok=True)
    out_dir = Path(os.environ.get("OUT", "."))
    t_all = time.time()
    result = {"env": BENCH.environment(), "config": dict(OURS.CONFIG)}
    print(json.dumps(result["env"]), flush=True)
    roles = list(OURS_ROLES) + ["baselines"] + ([] if args.no_flashinfer else ["flashinfer"])
    roles += [] if args.skip_sanitizer else ["sanitizer"]
    procs = {role: _child(role, args) for role in roles}
    phase1 = {}
    for role, proc in procs.items():
        try:
            proc.wait(timeout=max(1.0, t_all + args.phase1_s - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        path = Path(args.tmp) / f"{_stem(role)}.json"
        log = (Path(args.tmp) / f"{_stem(role)}.log").read_text()
        if proc.returncode == 0 and path.exists():
            phase1[role] = json.loads(path.read_text())
        else:
            phase1[role] = {"error": f"rc={proc.returncode}", "log_tail": log[-3000:],
                            "partial": json.loads(path.read_text()) if path.exists() else None}
        print(f"phase 1 {role}: rc={proc.returncode} at {time.time() - t_all:.0f} s", flush=True)
    result["phase1"] = phase1
    result["phase1_s"] = time.time() - t_all
    dump = lambda: (out_dir / "mla_compare.json").write_text(json.dumps(result, indent=1))  # noqa: E731
    dump()
    before = Path(args.before) if args.before else None
    fi_ok = not args.no_flashinfer and isinstance(phase1.get("flashinfer"), dict) and "build_and_check" in phase1[
        "flashinfer"]
    impls = implementations(before, with_flashinfer=fi_ok)
    for role in OURS_ROLES:
        if not isinstance(phase1.get(role), list):  # a hang or a crash there: keep our kernel off the timed GPU
            impls = {n: i for n, i in impls.items() if n not in ("ours", "ours-jit")}
    result["impls"] = {n: i.why for n, i in impls.items()}
    result["copy_tbps"] = BENCH.copy_bandwidth()
    t0 = time.time()
    result["timing"], result["host"] = [], []
    timing(impls, list(impls), args.quick, result["timing"], result["host"], dump)
    result["timing_s"] = time.time() - t0
    result["env_after"] = BENCH.environment()
    result["seconds"] = time.time() - t_all
    dump()
    report(result)
    return 0


def report(result: dict) -> None:
    phase1 = result["phase1"]
    rows = []
    for role in OURS_ROLES:
        entry = phase1.get(role)
        rows += entry if isinstance(entry, list) else (entry or {}).get("partial") or []
    for role, key in (("baselines", "correctness"), ("flashinfer", "build_and_check")):
        if isinstance(phase1.get(role), dict):
            rows += phase1[role].get(key, [])
    bad = [r for r in rows if not r.get("ok")]
    print(f"\n== correctness: {len(rows) - len(bad)}/{len(rows)} checks pass "
          f"(tol o {TOL['o']:.1e}, lse {TOL['lse']:.1e})")
    for r in bad:
        print(f"  FAIL {r}")
    worst = {}
    for r in rows:
        if "err_o" in r:
            w = worst.setdefault(r["impl"], [0.0, 0.0])
            w[0], w[1] = max(w[0], r["err_o"]), max(w[1], r["err_lse"])
    for name, (eo, el) in worst.items():
        print(f"  {name:12s} worst o {eo:.2e} lse {el:.2e}")
    print(f"  compile: {json.dumps((phase1.get('baselines') or {}).get('compile'))[:1500]}")
    print(f"  sanitizer: {json.dumps(phase1.get('sanitizer'))[:1500]}")
    for role, value in phase1.items():
        if isinstance(value, dict) and "error" in value:
            print(f"  {role} FAILED: {value['error']}\n{value.get('log_tail', '')[-1500:]}")
    names = list(result["impls"])
    print(f"\n== graph us / eager us per call (rotated buffers); copy {result['copy_tbps']:.2f} TB/s; "
          f"{result['env']['gpu']}, torch {torch.__version__}")
    print(f"{'shape':6s} " + " ".join(f"{n:>17s}" for n in names))
    for sname in TIMED:
        cells = []
        for n in names:
            r = next((r for r in result["timing"] if r["shape"] == sname and r["impl"] == n), None)
            if r is None:
                cells.append(f"{'-':>17s}")
            elif "graph_us" in r:
                cells.append(f"{r['graph_us']:7.1f}/{r['eager_us'] or math.nan:8.1f}")
            else:
                cells.append(f"{'ERR':>17s}")
        print(f"{sname:6s} " + " ".join(f"{c:>17s}" for c in cells))
    print("\n== host us per eager call (no sync)")
    for h in result["host"]:
        print(f"  {h['shape']:6s} {h['impl']:12s} {h['host_us']:8.1f}")
    print(f"\ntotal {result['seconds']:.0f} s (phase 1 {result['phase1_s']:.0f} s, timing {result['timing_s']:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
