"""`workbench task import kernelbench FILE...`: tasks from KernelBench problem files.

A KernelBench problem is a file with `class Model(nn.Module)`, `get_inputs()` (the forward's arguments) and
`get_init_inputs()` (the constructor's), sized by module-level constants (`batch_size = 16`). The task's forward takes
the runtime inputs, then the model's parameters and buffers (seeded, passed as inputs, so a candidate sees the same
weights), then the constructor's scalar arguments; the reference runs the model through torch.func.functional_call.
The module-level int constants the problem reads are the shape's params, so CPU shapes are the same problem with
smaller constants.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

from workbench import pyast
from workbench.tasks import probe, templates
from workbench.tasks.model import TaskError
from workbench.tasks.scaffold import SMALL_PARAM, Spec

_HELPERS = '''
_SKELETONS = {}


class _Here(torch.overrides.TorchFunctionMode):
    """Problem files often create inputs with device="cuda": build them where make_inputs was asked to instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = torch.get_default_device()
        return func(*args, **kwargs)


def _configure(shape):
    """Re-run the problem's module-level assignments with the shape's sizes, so derived constants follow them."""
    namespace = vars(PROBLEM)
    for statement, names in ASSIGNS:
        exec(statement, namespace)
        for name in names:
            if name in SIZES:
                namespace[name] = shape[name]
            elif name in TUPLES:
                namespace[name] = tuple(shape[f"{name}_{i}"] for i in range(TUPLES[name]))
    for name in LITERALS:
        namespace[name] = shape[name]
    if GET_INPUTS:
        exec(GET_INPUTS, namespace)  # get_inputs with its literal sizes read from LITERALS' names


def _skeleton(init, device):
    """The model's modules for one constructor call (built once per device; its weights are replaced per call)."""
    key = (repr(init), str(device))
    if key not in _SKELETONS:
        with torch.device(device):
            _SKELETONS[key] = PROBLEM.Model(*init)
    return _SKELETONS[key]
'''

_BUILD = '''_configure(shape)
with _Here():
    init = list(PROBLEM.get_init_inputs())
    model = PROBLEM.Model(*init)
    runtime = list(PROBLEM.get_inputs())
state = dict(model.named_parameters())
state.update(model.named_buffers())
return runtime + [state[key].detach() for key in WEIGHTS.values()] + [init[i] for i in INIT.values()]'''

_CALL = '''tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
init = [inputs[name] if name in INIT else value for name, value in zip(INIT_ORDER, INIT_VALUES)]
model = _skeleton(init, tensors[0].device if tensors else "cpu")
params = {key: upcast(inputs[name]) for name, key in WEIGHTS.items()}
return torch.func.functional_call(model, params, tuple(upcast(inputs[a]) for a in RUNTIME))'''


def task_name(path: Path, prefix: str = "kb_") -> str:
    """A task name from a KernelBench file name: 1_Square_matrix_multiplication_.py -> kb_1_square_matrix_multiplication."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem).strip("_").lower()
    return f"{prefix}{stem}"


def _ident(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", name).strip("_") or "w"
    if base[0].isdigit():
        base = "w_" + base
    out, n = base, 1
    while out in taken:
        n += 1
        out = f"{base}_{n}"
    taken.add(out)
    return out


def _int_literal(expr: ast.AST) -> int | tuple[int, ...] | None:
    """An int or a tuple of ints written with literals only (`16`, `2048 * 2`, `(3, 5)`), else None: values computed
    from other names stay derived and are recomputed per shape."""
    if any(isinstance(n, (ast.Name, ast.Call, ast.Attribute, ast.Subscript)) for n in ast.walk(expr)):
        return None
    try:
        value = eval(compile(ast.Expression(expr), "<constant>", "eval"), {"__builtins__": {}})  # literals only
    except Exception:  # noqa: BLE001 - 1 / 0 and friends: not a size
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, tuple) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    return None


_FACTORIES = {"rand", "randn", "zeros", "ones", "empty"}
"""torch functions whose positional arguments are all sizes (each an int or a tuple of ints)."""


def _size_slots(call: ast.Call) -> list[tuple[list[ast.expr], int]]:
    """Where a torch factory call holds its sizes: (container, index) of each size expression, so it can be replaced.

    `torch.rand(b, 3, 224)`, `torch.zeros((b, 224))`, `torch.randint(0, 10, (b, 224))`, `torch.full((b, 224), 0.5)`
    and `size=` keywords; any other call has none.
    """
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "torch"):
        return []
    if func.attr in _FACTORIES:
        positions = list(range(len(call.args)))
    elif func.attr == "randint" and len(call.args) >= 2:
        positions = [len(call.args) - 1]
    elif func.attr == "full" and call.args:
        positions = [0]
    else:
        positions = []
    slots: list[tuple[list[ast.expr], int]] = []
    exprs = [(call.args, i) for i in positions] + [(kw, -1) for kw in call.keywords if kw.arg == "size"]
    for holder, i in exprs:
        expr = holder[i] if isinstance(holder, list) else holder.value  # type: ignore[union-attr]
        if isinstance(expr, (ast.Tuple, ast.List)):
            slots += [(expr.elts, j) for j in range(len(expr.elts))]
        elif isinstance(holder, list):
            slots.append((holder, i))
    return slots


def _lift_literal_sizes(fn: ast.FunctionDef, runtime: list[str], taken: set[str]) -> dict[str, int]:
    """Give get_inputs' literal sizes (`torch.rand(batch_size, 3, 224, 224)`: the 224s) names, so the shapes can scale
    them like the module constants; the function is rewritten in place to read the names.

    Returns:
        name -> the literal, for each size above SMALL_PARAM (smaller ones are channel counts and the like, and
        stay as written). A name is the input's (its forward argument, or the variable it is assigned to) plus the
        dimension: x_dim2.
    """
    labels: dict[int, str] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            labels.update({id(c): node.targets[0].id for c in ast.walk(node.value) if isinstance(c, ast.Call)})
        elif isinstance(node, ast.Return) and isinstance(node.value, (ast.List, ast.Tuple)):
            for i, elt in enumerate(node.value.elts):
                label = runtime[i] if i < len(runtime) else f"input{i}"
                labels.update({id(c): label for c in ast.walk(elt) if isinstance(c, ast.Call)})
    lifted: dict[str, int] = {}
    for call in [c for c in ast.walk(fn) if isinstance(c, ast.Call)]:
        for dim, (container, i) in enumerate(_size_slots(call)):
            value = container[i]
            if isinstance(value, ast.Constant) and type(value.value) is int and value.value > SMALL_PARAM:
                name = _ident(f"{labels.get(id(call), 'input')}_dim{dim}", taken)
                container[i] = ast.copy_location(ast.Name(id=name, ctx=ast.Load()), value)
                lifted[name] = value.value
    return lifted


def _assigned(node: ast.Assign) -> tuple[list[str], list[ast.expr]]:
    """(names, value expressions) a module-level assignment binds: `n = 16`, `d, h = 16, 32`, and chains such as
    `height = width = 256` (each name gets the value); ([], []) for any other target."""
    names: list[str] = []
    values: list[ast.expr] = []
    for target in node.targets:
        if isinstance(target, ast.Name):
            names.append(target.id)
            values.append(node.value)
        elif isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts) and \
                isinstance(node.value, ast.Tuple) and len(node.value.elts) == len(target.elts):
            names += [e.id for e in target.elts]  # type: ignore[attr-defined]
            values += list(node.value.elts)
        else:
            return [], []
    return names, values


def spec_from_file(path: Path, name: str, command: str) -> Spec:
    """The Spec of one KernelBench problem file.

    Raises:
        TaskError: the file is not a KernelBench problem or cannot be converted (one line saying why).
    """
    import torch

    try:
        source = path.read_text(encoding="utf-8")
        tree = pyast.parse(source, filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        raise TaskError(f"{path}: cannot read it as Python ({probe.describe(exc)})") from None
    top = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for needed in ("Model", "get_inputs"):
        if needed not in top:
            raise TaskError(f"{path}: {needed}: missing (a KernelBench problem defines class Model, get_inputs() and "
                            f"get_init_inputs())")
    loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    sizes: list[str] = []
    tuples: dict[str, int] = {}
    params: dict[str, Any] = {}
    assigns: list[list[Any]] = []
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        names, values = _assigned(node)
        if not names:
            continue
        assigns.append([ast.get_source_segment(source, node), names])
        for var, expr in zip(names, values):
            if var not in loads:
                continue
            literal = _int_literal(expr)
            if isinstance(literal, int):
                sizes.append(var)
                params[var] = literal
            elif isinstance(literal, tuple):
                tuples[var] = len(literal)
                params.update({f"{var}_{i}": v for i, v in enumerate(literal)})
    try:
        module = probe.load_file(path.resolve(), f"workbench_kernelbench_{abs(hash(str(path.resolve())))}")
    except Exception as exc:  # noqa: BLE001 - the problem's own module code
        raise TaskError(f"{path}: importing it raised {probe.describe(exc)}") from None
    if "get_init_inputs" not in top:
        module.get_init_inputs = lambda: []  # older files construct Model() without arguments

    class _Meta(torch.overrides.TorchFunctionMode):  # the same device override the generated reference makes
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
            kwargs = dict(kwargs or {})
            if "device" in kwargs:
                kwargs["device"] = "meta"
            return func(*args, **kwargs)

    try:
        with torch.device("meta"), _Meta():
            init = list(module.get_init_inputs())
            model = module.Model(*init)
            runtime = list(module.get_inputs())
    except Exception as exc:  # noqa: BLE001
        raise TaskError(f"{path}: building the model and its inputs on the meta device raised "
                        f"{probe.describe(exc)}") from None
    if not isinstance(model, torch.nn.Module):
        raise TaskError(f"{path}: Model: is not a torch.nn.Module")
    taken: set[str] = set()
    forward_params = [p for p in inspect.signature(model.forward).parameters.values()]
    if any(p.kind == p.VAR_POSITIONAL for p in forward_params):
        runtime_names = [_ident(f"x{i}", taken) for i in range(len(runtime))]
    else:
        names = [p.name for p in forward_params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(names) < len(runtime):
            raise TaskError(f"{path}: get_inputs: returns {len(runtime)} values, Model.forward takes {len(names)}")
        runtime_names = [_ident(n, taken) for n in names[:len(runtime)]]
    module_names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | set(top) | set(vars(module))
    literals = _lift_literal_sizes(top["get_inputs"], runtime_names, module_names)  # type: ignore[arg-type]
    params.update(literals)
    state = list(dict(model.named_parameters()).items()) + list(dict(model.named_buffers()).items())
    weights = {_ident(key.replace(".", "_"), taken): key for key, _ in state}
    init_params = [p.name for p in inspect.signature(module.Model.__init__).parameters.values()][1:]
    init_order = [init_params[i] if i < len(init_params) else f"init{i}" for i in range(len(init))]
    init_inputs: dict[str, int] = {}
    for i, value in enumerate(init):
        if isinstance(value, torch.Tensor):
            raise TaskError(f"{path}: get_init_inputs: returns a tensor (argument {i}); only scalars are supported")
        if isinstance(value, (int, float, bool)) or (isinstance(value, tuple) and all(
                isinstance(v, (int, float)) for v in value)):
            init_inputs[_ident(init_order[i], taken)] = i
    doc = (inspect.getdoc(module.Model) or "").strip().splitlines()
    adapter = templates.Adapter(
        kind="kernelbench",
        args=runtime_names + list(weights) + list(init_inputs),
        constants={
            "SIZES": sizes,
            "TUPLES": tuples,
            "ASSIGNS": assigns,
            "LITERALS": list(literals),
            "GET_INPUTS": ast.unparse(top["get_inputs"]) if literals else "",
            "RUNTIME": runtime_names,
            "WEIGHTS": weights,
            "INIT": init_inputs,
            "INIT_ORDER": list(init_inputs.keys()) if len(init_inputs) == len(init) else
            [next((k for k, v in init_inputs.items() if v == i), f"_init{i}") for i in range(len(init))],
            "INIT_VALUES": [v if not isinstance(v, torch.Tensor) else None for v in init],
        },
        build=_BUILD,
        call=_CALL,
        origin=f"KernelBench problem {path.name}",
        helpers=_HELPERS,
    )
    return Spec(
        name=name,
        description=f"KernelBench {path.stem}: {doc[0]}" if doc else f"KernelBench problem {path.stem}",
        problem_source=source,
        adapter=adapter,
        cuda=[params],
        command=command,
    )
