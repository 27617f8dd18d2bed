"""`workbench task new NAME --from FILE:FUNCTION --inputs FILE:FUNCTION`: a task from a PyTorch function.

The reference is the function; the inputs function takes the shape's sizes as keyword arguments (their defaults are
the first benchmark shape, `--shape k=v,...` adds others) and returns the function's arguments for that shape: a
dict keyed by parameter name, a tuple in parameter order, or one tensor.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

from workbench import pyast
from workbench.tasks import probe, templates
from workbench.tasks.model import TaskError
from workbench.tasks.scaffold import Spec

INPUTS_FILE = "problem_inputs.py"
"""Where the inputs function's file is copied when it is not the reference's own file."""


def parse_target(text: str, flag: str) -> tuple[Path, str]:
    """FILE:FUNCTION into (path, function name).

    Raises:
        TaskError: no colon, no such file, or a function name that is not an identifier.
    """
    file, sep, func = text.rpartition(":")
    if not sep or not file or not func.isidentifier():
        raise TaskError(f"{flag} {text}: expected FILE:FUNCTION, e.g. my_op.py:rmsnorm")
    path = Path(file)
    if not path.is_file():
        raise TaskError(f"{flag} {text}: no such file {file}")
    return path, func


def parse_shape(text: str) -> dict[str, Any]:
    """`rows=4096,cols=1024` into {"rows": 4096, "cols": 1024} (ints, then floats, else strings).

    Raises:
        TaskError: an entry without `=` or with a name that is not an identifier.
    """
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        if not sep or not key.strip().isidentifier():
            raise TaskError(f"--shape {text}: expected NAME=VALUE[,NAME=VALUE...], e.g. rows=4096,cols=1024")
        for kind in (int, float):
            try:
                out[key.strip()] = kind(raw)
                break
            except ValueError:
                continue
        else:
            out[key.strip()] = raw.strip()
    return out


def _function(path: Path, name: str, flag: str):
    try:
        module = probe.load_file(path.resolve(), f"workbench_user_{path.stem}_{abs(hash(str(path.resolve())))}")
    except Exception as exc:  # noqa: BLE001 - the person's own file
        raise TaskError(f"{flag} {path}:{name}: importing {path} raised {probe.describe(exc)}") from None
    fn = vars(module).get(name)
    if not callable(fn):
        raise TaskError(f"{flag} {path}:{name}: {path} defines no function {name}")
    return fn


def output_names(path: Path, func: str) -> list[str]:
    """Names for the outputs from the function's return statement (`return o, lse`), or [] when it has none."""
    try:
        tree = pyast.parse(path.read_text(encoding="utf-8"))
    except SyntaxError:
        return []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == func:
            returns = [n for n in ast.walk(node) if isinstance(n, ast.Return) and n.value is not None]
            if len(returns) != 1:
                return []
            value = returns[0].value
            elts = value.elts if isinstance(value, ast.Tuple) else [value]
            names = [e.id for e in elts if isinstance(e, ast.Name)]
            return names if len(names) == len(elts) and len(set(names)) == len(names) else []
    return []


def spec_from_function(name: str, source: str, inputs: str, shapes: list[str], command: str) -> Spec:
    """The Spec of a task built from a reference function and an inputs function.

    Raises:
        TaskError: a file or function that cannot be used (one line naming the flag).
    """
    import torch

    src_path, src_fn = parse_target(source, "--from")
    in_path, in_fn = parse_target(inputs, "--inputs")
    fn = _function(src_path, src_fn, "--from")
    make = _function(in_path, in_fn, "--inputs")
    params = inspect.signature(fn).parameters
    arg_names = [p.name for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    defaults = {p.name: p.default for p in inspect.signature(make).parameters.values()
                if p.default is not inspect.Parameter.empty and isinstance(p.default, (int, float, str, bool))
                and p.name != "device"}
    required = [p.name for p in inspect.signature(make).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    rows = [{**defaults, **parse_shape(s)} for s in shapes] or [dict(defaults)]
    for row in rows:
        missing = [r for r in required if r not in row]
        if missing:
            raise TaskError(f"--inputs {inputs}: {in_fn}() needs {', '.join(missing)}, which has no default; "
                            f"give it with --shape {missing[0]}=N")
    sizes = list(rows[0])
    if not sizes:
        raise TaskError(f"--inputs {inputs}: {in_fn}() takes no size parameters; give it keyword parameters with "
                        f"defaults (e.g. rows=4096, cols=4096) so the workbench can scale them")
    try:
        with torch.device("meta"):
            example = make(**rows[0])
    except Exception as exc:  # noqa: BLE001
        raise TaskError(f"--inputs {inputs}: {in_fn}({rows[0]}) raised {probe.describe(exc)} "
                        f"(on the meta device, which the workbench uses to size shapes)") from None
    if isinstance(example, dict):
        unknown = [k for k in example if k not in arg_names]
        if unknown:
            raise TaskError(f"--inputs {inputs}: {in_fn}() returns {', '.join(unknown)}, which {src_fn}() does not "
                            f"take (it takes {', '.join(arg_names)})")
        args = [a for a in arg_names if a in example]
    elif isinstance(example, (tuple, list)):
        if len(example) > len(arg_names):
            raise TaskError(f"--inputs {inputs}: {in_fn}() returns {len(example)} values, {src_fn}() takes "
                            f"{len(arg_names)}")
        args = arg_names[:len(example)]
    elif isinstance(example, torch.Tensor):
        args = arg_names[:1]
    else:
        raise TaskError(f"--inputs {inputs}: {in_fn}() returns a {type(example).__name__}; return a dict, a tuple "
                        f"or a tensor of {src_fn}()'s arguments")
    if not args:
        raise TaskError(f"--from {source}: {src_fn}() takes no positional parameters to feed inputs to")

    same_file = src_path.resolve() == in_path.resolve()
    helpers = ""
    inputs_module = "PROBLEM"
    extra: dict[str, str] = {}
    if not same_file:
        extra[INPUTS_FILE] = in_path.read_text(encoding="utf-8")
        inputs_module = "INPUTS_MODULE"
        helpers = f'''
_inputs_spec = importlib.util.spec_from_file_location("workbench_inputs_{name}", Path(__file__).with_name("{INPUTS_FILE}"))
INPUTS_MODULE = importlib.util.module_from_spec(_inputs_spec)
sys.modules[_inputs_spec.name] = INPUTS_MODULE
_inputs_spec.loader.exec_module(INPUTS_MODULE)
'''
    doc = (inspect.getdoc(fn) or "").strip().splitlines()
    adapter = templates.Adapter(
        kind="function",
        args=args,
        constants={"SIZES": sizes, "OUTPUT_NAMES": output_names(src_path, src_fn)},
        build=f"return {inputs_module}.{in_fn}(**{{k: shape[k] for k in SIZES}})",
        call=f"return PROBLEM.{src_fn}(*(upcast(inputs[a]) for a in ARGS))",
        origin=f"{src_path.name}:{src_fn} with inputs from {in_path.name}:{in_fn}",
        helpers=helpers,
    )
    return Spec(
        name=name,
        description=doc[0] if doc else f"{src_fn} from {src_path.name} (a task made by `workbench task new`)",
        problem_source=src_path.read_text(encoding="utf-8"),
        adapter=adapter,
        cuda=rows,
        command=command,
        extra_files=extra,
    )
