"""FlashInfer-Bench's formats: a Definition (+ Workloads) in as a task folder; a session's best attempt out as a
Solution and a Trace with its evaluation.

The formats, as documented by flashinfer-bench (its flashinfer_bench.data models): a Definition has `name`,
`op_type`, `axes` (each {"type": "const", "value": N} or {"type": "var"}), `inputs` and `outputs` (each {"shape":
[axis names] or null for a scalar, "dtype"}), and `reference`, Python code with a top-level `run(*inputs)` that
returns the outputs. A Workload is {"axes": {var axis: value}, "inputs": {name: {"type": "random" | "scalar" |
"safetensors", ...}}, "uuid"}; a workloads file holds one per line, bare or inside a workload trace
{"definition", "workload"}. The flashinfer-bench package itself is not a dependency: it pulls in flashinfer, a kernel
library that must stay out of this environment, so the schema's rules are checked here.
"""

from __future__ import annotations

import ast
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from workbench import pyast
from workbench.tasks import templates
from workbench.tasks.model import TaskError
from workbench.tasks.scaffold import Spec

DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float4_e2m1", "int64", "int32", "int16",
          "int8", "bool")
"""The Definition schema's dtypes."""
STATUSES = ("PASSED", "INCORRECT_SHAPE", "INCORRECT_NUMERICAL", "INCORRECT_DTYPE", "RUNTIME_ERROR", "COMPILE_ERROR",
            "TIMEOUT")
"""EvaluationStatus values of a Trace."""
DEFINITION_FILE = "definition.json"
"""Where a task folder keeps its Definition (imported ones, and kda / mla_decode)."""
WORKLOADS_FILE = "workloads.jsonl"

_HELPERS = '''

def _random(shape, dtype):
    """FlashInfer-Bench's documented random inputs: randn floats, float8 from clamped randn, ints in [-1024, 1024)."""
    if dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        return torch.randn(shape, dtype=dtype)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return torch.randn(shape).clamp_(-2.0, 2.0).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, dtype=torch.bool)
    low = -128 if dtype == torch.int8 else -1024
    return torch.randint(low, -low, shape, dtype=dtype)
'''

_BUILD = '''values = {}
for name, (axes, dtype) in INPUT_SPECS.items():
    if axes is None:
        values[name] = shape[name]
    else:
        values[name] = _random(tuple(shape[a] for a in axes), getattr(torch, dtype))
return values'''

_CALL = '''return PROBLEM.run(*(upcast(inputs[a]) for a in ARGS))'''


def _fail(where: str, problem: str) -> TaskError:
    return TaskError(f"{where}: {problem}")


def check_definition(data: Any, where: str = "definition") -> dict[str, Any]:
    """Validate a Definition against the documented schema.

    Raises:
        TaskError: one line naming the field, e.g. `definition.axes.seq_len.value: must be an int >= 0`.
    """
    if not isinstance(data, dict):
        raise _fail(where, "must be a JSON object")
    for key in ("name", "op_type", "axes", "inputs", "outputs", "reference"):
        if key not in data:
            raise _fail(f"{where}.{key}", "missing")
    for key in ("name", "op_type", "reference"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise _fail(f"{where}.{key}", "must be a non-empty string")
    if not isinstance(data["axes"], dict) or not data["axes"]:
        raise _fail(f"{where}.axes", "must be a non-empty object of axes")
    for name, axis in data["axes"].items():
        at = f"{where}.axes.{name}"
        if not isinstance(axis, dict) or axis.get("type") not in ("const", "var"):
            raise _fail(at, 'must be {"type": "const", "value": N} or {"type": "var"}')
        if axis["type"] == "const":
            value = axis.get("value")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _fail(f"{at}.value", "a const axis needs an int value >= 0")
    for group in ("inputs", "outputs"):
        specs = data[group]
        if not isinstance(specs, dict) or not specs:
            raise _fail(f"{where}.{group}", "must be a non-empty object of tensor specs")
        for name, spec in specs.items():
            at = f"{where}.{group}.{name}"
            if not name.isidentifier():
                raise _fail(at, "the name must be a Python identifier (it becomes a parameter)")
            if not isinstance(spec, dict) or "dtype" not in spec or "shape" not in spec:
                raise _fail(at, 'must be {"shape": [axis, ...] or null, "dtype": ...}')
            if spec["dtype"] not in DTYPES:
                raise _fail(f"{at}.dtype", f"{spec['dtype']!r} is not one of {', '.join(DTYPES)}")
            shape = spec["shape"]
            if shape is not None:
                if not isinstance(shape, list):
                    raise _fail(f"{at}.shape", "must be a list of axis names or null")
                for axis in shape:
                    if axis not in data["axes"]:
                        raise _fail(f"{at}.shape", f"references undefined axis {axis!r}")
    if set(data["inputs"]) & set(data["outputs"]):
        raise _fail(f"{where}.outputs", "input and output names must not overlap")
    try:
        tree = pyast.parse(data["reference"])
    except SyntaxError as exc:
        raise _fail(f"{where}.reference", f"not valid Python: {exc.msg} (line {exc.lineno})") from None
    if not any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body):
        raise _fail(f"{where}.reference", "must define a top-level function run")
    return data


def read_workloads(path: Path, definition: str) -> list[dict[str, Any]]:
    """The workloads for `definition` in a JSONL file (bare Workloads or workload traces).

    Raises:
        TaskError: an unreadable file or a line that is not a workload (one line naming the line).
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TaskError(f"--workloads {path}: cannot read it ({exc.strerror})") from None
    found = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise TaskError(f"{path}:{i}: not JSON ({exc})") from None
        if isinstance(record, dict) and "workload" in record:
            if record.get("definition") not in (None, definition):
                continue
            record = record["workload"]
        if not isinstance(record, dict) or not isinstance(record.get("axes"), dict):
            raise TaskError(f"{path}:{i}: not a workload (needs an axes object)")
        found.append({**record, "_line": i})
    return found


def spec_from_definition(data: dict[str, Any], workloads: list[dict[str, Any]], name: str, command: str,
                         source: str) -> Spec:
    """The Spec of a task built from a Definition and its Workloads.

    Raises:
        TaskError: a var axis that no workload sets, a workload input that cannot be reproduced, and the like.
    """
    check_definition(data)
    axes = data["axes"]
    var = [a for a, spec in axes.items() if spec["type"] == "var"]
    const = {a: spec["value"] for a, spec in axes.items() if spec["type"] == "const"}
    scalars = [n for n, spec in data["inputs"].items() if spec["shape"] is None]
    if var and not workloads:
        raise _fail(f"definition.axes.{var[0]}", f"a var axis needs values: pass --workloads FILE.jsonl "
                                                  f"(var axes: {', '.join(var)})")
    rows = []
    for w in workloads:
        at = f"{source}:{w['_line']}" if source else f"workload {w.get('uuid', '?')}"
        for a in var:
            if a not in w["axes"]:
                raise _fail(f"definition.axes.{a}", f"var axis set by no value in workload {at} "
                                                    f"(it sets {', '.join(w['axes']) or 'nothing'})")
            value = w["axes"][a]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _fail(f"{at}.axes.{a}", f"must be an int >= 0, got {value!r}")
        row: dict[str, Any] = {**const, **{a: w["axes"][a] for a in var}}
        inputs = w.get("inputs") or {}
        for n, spec in inputs.items():
            kind = spec.get("type") if isinstance(spec, dict) else None
            if kind == "safetensors":
                raise _fail(f"{at}.inputs.{n}", "safetensors inputs are not supported (their blobs are not part of "
                                                "the definition); use random or scalar inputs")
            if kind not in ("random", "scalar"):
                raise _fail(f"{at}.inputs.{n}", f"unknown input type {kind!r}")
        for n in scalars:
            spec = inputs.get(n)
            if not (isinstance(spec, dict) and spec.get("type") == "scalar"):
                raise _fail(f"{at}.inputs.{n}", "a scalar input (shape null) needs a scalar value in every workload")
            value = spec.get("value")
            if not isinstance(value, (int, float, bool)):
                raise _fail(f"{at}.inputs.{n}.value", f"must be a number or a boolean, got {value!r}")
            row[n] = value
        rows.append(row)
    if not rows:
        rows = [dict(const)]
    args = list(data["inputs"])
    adapter = templates.Adapter(
        kind="flashinfer",
        args=args,
        constants={
            "INPUT_SPECS": {n: [spec["shape"], _torch_dtype(spec["dtype"])] for n, spec in data["inputs"].items()},
            "OUTPUT_NAMES": list(data["outputs"]),
        },
        build=_BUILD,
        call=_CALL,
        origin=f"FlashInfer-Bench definition {data['name']} ({data['op_type']})",
        helpers=_HELPERS,
    )
    # Only var axes scale: references often hard-code their const axes (a definition is one size of an op).
    scalable = [a for a in var if any(isinstance(r.get(a), int) and r[a] > 8 for r in rows)]
    workload_lines = "".join(json.dumps({k: v for k, v in w.items() if k != "_line"}) + "\n" for w in workloads)
    return Spec(
        name=name,
        description=(data.get("description") or f"FlashInfer-Bench definition {data['name']}").strip().splitlines()[0],
        problem_source=f"# The reference of FlashInfer-Bench definition {data['name']}, unchanged.\n" + data["reference"],
        adapter=adapter,
        cuda=rows,
        command=command,
        scalable=scalable,
        output_axes=[spec["shape"] for spec in data["outputs"].values()],
        extra_files={DEFINITION_FILE: json.dumps(data, indent=2) + "\n", WORKLOADS_FILE: workload_lines},
    )


def _torch_dtype(dtype: str) -> str:
    if dtype == "float4_e2m1":
        raise TaskError("definition: float4_e2m1 inputs are not supported yet (torch has no plain float4 dtype)")
    return dtype


def task_name(definition: str) -> str:
    """A task name from a Definition name (already a valid one unless it has odd characters)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", definition).strip("._-") or "definition"


# -- export -------------------------------------------------------------------------------------------------------
def _status(verdict: str | None, shape: dict[str, Any]) -> str:
    if verdict in ("ok", "incorrect", "implausible") and shape.get("correct") is False:
        return "INCORRECT_NUMERICAL"
    return {"ok": "PASSED", "compile_error": "COMPILE_ERROR", "timeout": "TIMEOUT"}.get(verdict or "", "RUNTIME_ERROR")


def solution_record(definition: dict[str, Any], name: str, author: str, source: str, note: str,
                    device: str) -> dict[str, Any]:
    """A Solution: one Triton file whose forward returns the outputs (not destination-passing)."""
    return {
        "name": name,
        "definition": definition["name"],
        "author": author,
        "spec": {
            "language": "triton",
            "target_hardware": ["cuda"] if device != "cpu" else ["cpu"],
            "entry_point": "kernel.py::forward",
            "dependencies": [],
            "destination_passing_style": False,
        },
        "sources": [{"path": "kernel.py", "content": source}],
        "description": note or f"best attempt of a workbench session on {definition['name']}",
    }


def trace_records(definition: dict[str, Any], solution: str, result: dict[str, Any], shapes: dict[str, dict],
                  timestamp: str) -> list[dict[str, Any]]:
    """One Trace per evaluated shape of a result: the workload it ran and its Evaluation."""
    env = result.get("env") or {}
    libs = {k: str(env[k]) for k in ("torch", "triton") if env.get(k)}
    hardware = re.sub(r"\W+", "_", str(result.get("device") or "unknown")).strip("_") or "unknown"
    var = [a for a, spec in definition["axes"].items() if spec["type"] == "var"]
    scalars = [n for n, spec in definition["inputs"].items() if spec["shape"] is None]
    traces = []
    for entry in result.get("shapes") or []:
        params = shapes.get(entry["name"], {})
        inputs: dict[str, Any] = {n: {"type": "random"} for n in definition["inputs"]}
        for n in scalars:
            if n in params:
                inputs[n] = {"type": "scalar", "value": params[n]}
        status = _status(result.get("verdict"), entry)
        evaluation: dict[str, Any] = {
            "status": status,
            "environment": {"hardware": hardware, "libs": libs},
            "timestamp": timestamp,
            "log": str(result.get("message", ""))[:2000],
        }
        if status in ("PASSED", "INCORRECT_NUMERICAL"):
            # The workbench measures rel_rms = rms(ref - out) / rms(ref); max errors are not recorded (NaN).
            evaluation["correctness"] = {"max_relative_error": "NaN", "max_absolute_error": "NaN",
                                         "extra": {"rel_rms": entry.get("rel_err"), "metric": "rel_rms"}}
        if status == "PASSED":
            ms, base = entry.get("ms"), entry.get("baseline_ms")
            evaluation["performance"] = {"latency_ms": ms or 0.0, "reference_latency_ms": base or 0.0,
                                         "speedup_factor": entry.get("speedup") or 0.0}
            if not result.get("timing_comparable", False):
                evaluation["log"] += " (Triton interpreter on a CPU: timings are not comparable)"
        traces.append({
            "definition": definition["name"],
            "workload": {"axes": {a: params[a] for a in var if a in params}, "inputs": inputs,
                         "uuid": f"{definition['name']}-{entry['name']}"},
            "solution": solution,
            "evaluation": evaluation,
        })
    return traces


def check_solution(data: Any) -> None:
    """Validate a Solution against the documented schema (used on what export writes).

    Raises:
        TaskError: one line naming the field.
    """
    for key in ("name", "definition", "author", "spec", "sources"):
        if key not in data:
            raise _fail(f"solution.{key}", "missing")
    spec = data["spec"]
    if spec.get("language") not in ("python", "triton", "cpp", "cuda", "tilelang"):
        raise _fail("solution.spec.language", f"{spec.get('language')!r} is not a supported language")
    if not spec.get("target_hardware"):
        raise _fail("solution.spec.target_hardware", "must list at least one target")
    entry = spec.get("entry_point", "")
    if entry.count("::") != 1:
        raise _fail("solution.spec.entry_point", f"{entry!r} is not FILE::FUNCTION")
    paths = [s.get("path") for s in data["sources"]]
    if not paths or len(set(paths)) != len(paths):
        raise _fail("solution.sources", "must list files with unique paths")
    for p in paths:
        if not p or Path(p).is_absolute() or ".." in Path(p).parts:
            raise _fail("solution.sources", f"path {p!r} must be relative, without '..'")
    if entry.split("::")[0] not in paths:
        raise _fail("solution.spec.entry_point", f"its file {entry.split('::')[0]!r} is not among the sources")


def check_trace(data: Any) -> None:
    """Validate a Trace (with its Evaluation) against the documented schema.

    Raises:
        TaskError: one line naming the field.
    """
    for key in ("definition", "workload"):
        if key not in data:
            raise _fail(f"trace.{key}", "missing")
    workload = data["workload"]
    for key in ("axes", "inputs", "uuid"):
        if key not in workload:
            raise _fail(f"trace.workload.{key}", "missing")
    evaluation = data.get("evaluation")
    if evaluation is None:
        return
    status = evaluation.get("status")
    if status not in STATUSES:
        raise _fail("trace.evaluation.status", f"{status!r} is not one of {', '.join(STATUSES)}")
    for key in ("environment", "timestamp"):
        if not evaluation.get(key):
            raise _fail(f"trace.evaluation.{key}", "missing")
    has_c, has_p = evaluation.get("correctness") is not None, evaluation.get("performance") is not None
    need_c, need_p = status in ("PASSED", "INCORRECT_NUMERICAL"), status == "PASSED"
    if has_c != need_c or has_p != need_p:
        raise _fail("trace.evaluation", f"status {status} must {'' if need_c else 'not '}carry correctness and "
                                        f"must {'' if need_p else 'not '}carry performance")
    if has_p:
        for key in ("latency_ms", "reference_latency_ms", "speedup_factor"):
            value = evaluation["performance"].get(key)
            if not isinstance(value, (int, float)) or value < 0:
                raise _fail(f"trace.evaluation.performance.{key}", "must be a number >= 0")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
