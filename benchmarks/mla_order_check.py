"""Graph us at M4 and M3 of ours (DESC auto), main's kernel and ours with host descriptors, interleaved in one order
and then in the reverse, over rotated inputs: whether a difference between them is the kernel or its place in the
run. Main's kernel is the mla_splitkv.py in BEFORE_DIR (default .devwork/s27/before). Run on a CUDA machine:
PYTHONPATH=. python3 benchmarks/mla_order_check.py [BEFORE_DIR] (writes mla_order_check.json to $OUT).
"""
import importlib.util, json, os, pathlib, sys
sys.path.insert(0, "benchmarks")
import mla_bench as B
BEFORE = sys.argv[1] if len(sys.argv) > 1 else ".devwork/s27/before"
spec = importlib.util.spec_from_file_location("before", BEFORE + "/mla_splitkv.py")
before = importlib.util.module_from_spec(spec); spec.loader.exec_module(before)
out = {}
for shape in ("M4", "M3"):
    params = {s["name"]: s["params"] for s in B.TASK["shapes"]["cuda"]}[shape]
    sets = B._input_sets(params, B.rotation(params))
    fns = {"ours": lambda **kw: B.OURS.forward(**kw), "main": lambda **kw: before.forward(**kw),
           "ours_host": lambda **kw: B.OURS.forward(**kw, config={"DESC": "host"})}
    graphs = {n: B.graph_of(f, sets) for n, f in fns.items()}
    a = B.time_graphs(graphs, len(sets), blocks=11)
    b = B.time_graphs(dict(reversed(list(graphs.items()))), len(sets), blocks=11)
    out[shape] = {n: [round(a[n]["median_us"], 2), round(b[n]["median_us"], 2)] for n in graphs}
    print(shape, out[shape], flush=True)
    del graphs, sets
pathlib.Path(os.environ.get("OUT", "."), "mla_order_check.json").write_text(json.dumps(out))
