"""Static checks on a candidate's source: an import allowlist, banned APIs and builtins, each finding with its line.

A candidate is one file of Triton kernels plus a Python launcher. It needs torch for allocation and views, triton
for kernels and a few pure stdlib helpers; everything else it could import or call is a way to skip the work
(library kernels, torch compute ops), to hide work from the timer (threads, side streams, CUDA graphs) or to reach
into the evaluator (frames, gc, ctypes, files). The runtime guards (guards/runtime.py) back these checks up for
whatever a static pass cannot see.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from workbench import pyast

if TYPE_CHECKING:
    from workbench.tasks import Task

ALLOWED_IMPORTS = ("torch", "triton", "math", "typing", "functools", "itertools", "dataclasses", "__future__",
                   "operator", "collections", "enum", "numbers")
"""Top-level modules a candidate may import. Anything else (threading, os, sys, ctypes, gc, inspect, importlib,
subprocess, numpy, kernel libraries) is refused, because none of it is needed to write and launch a kernel."""

BANNED_APIS = (
    # Private torch internals reach the dispatcher, dispatch modes and the profiler the evaluator relies on.
    "torch._",
    "torch.utils", "torch.profiler", "torch.ops", "torch.library", "torch.compile", "torch.jit", "torch.fx",
    "torch.export", "torch.hub", "torch.load", "torch.save", "torch.from_file", "torch.multiprocessing",
    "torch.distributed", "torch.backends", "torch.autocast", "torch.amp", "torch.cuda.amp",
    "torch.set_float32_matmul_precision", "torch.set_default_dtype", "torch.set_flush_denormal",
    # Work on another stream, in a graph, or timed by the candidate escapes or fakes the timed window.
    "torch.Stream", "torch.cuda.Stream", "torch.cuda.ExternalStream", "torch.cuda.stream", "torch.cuda.streams",
    "torch.cuda.set_stream", "torch.cuda.graph", "torch.cuda.graphs", "torch.cuda.CUDAGraph",
    "torch.cuda.make_graphed_callables", "torch.cuda.Event", "torch.cuda.cudart", "torch.get_device_module",
    # Triton's runtime and compiler load arbitrary binaries; triton.ops ships library kernels.
    "triton.runtime", "triton.compiler", "triton.backends", "triton.tools", "triton.ops",
)
"""Dotted names (prefixes) a candidate may not use even though their top-level module is allowed."""

ALLOWED_UNDER_BANNED = ("triton.tools.tensor_descriptor", "torch._C._cuda_getCurrentRawStream")
"""Exceptions inside those prefixes: the host-side TMA descriptor is how a Hopper kernel gets bulk tensor copies,
and it only describes a tensor the candidate already holds; the current stream's raw handle is what Triton's own
launcher reads before every launch (a read, and public torch.cuda.current_stream() gives the same number 4 us
slower), which a candidate needs to call its compiled kernel's launch itself."""

BANNED_BUILTINS = ("open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "setattr",
                   "delattr", "breakpoint", "input")
"""Builtins that read files, run code built at run time, or reach other objects' namespaces."""

BANNED_ATTRS = ("as_subclass", "f_locals", "f_globals", "f_back", "gi_frame", "cr_frame", "tb_frame")
"""Attribute names with no use in a kernel launcher: Tensor subclassing and frame introspection."""

TENSOR_TYPES = ("torch.Tensor", "torch.nn.Parameter")
"""A class deriving from these is a Tensor subclass, which can defer or fake its values (HARNESS.md C3)."""

_IMPORT_CALLS = {"__import__", "importlib.import_module", "import_module"}
"""Calls that import a module named by a string; a literal name is checked like an import statement."""


@dataclass(frozen=True)
class Finding:
    """One violation: the rule it breaks, where, and a message a person can act on."""

    rule: str
    """A stable id, e.g. "forbidden-import" or "forbidden-torch-op"."""
    line: int
    col: int
    message: str

    def to_dict(self) -> dict[str, object]:
        """Plain data for the result JSON."""
        return {"rule": self.rule, "line": self.line, "col": self.col, "message": self.message}


def _matches(module: str, banned: Iterable[str]) -> str | None:
    for name in banned:
        if module == name or module.startswith(name + "."):
            return name
    return None


def allowed_module(module: str) -> bool:
    """Whether a dotted module name is importable by a candidate (allowlisted top level, no banned API prefix)."""
    return module.split(".")[0] in ALLOWED_IMPORTS and banned_api(module) is None


def _allowed_exception(dotted: str) -> bool:
    """Whether a dotted name is one of ALLOWED_UNDER_BANNED or inside one."""
    return any(dotted == ok or dotted.startswith(ok + ".") for ok in ALLOWED_UNDER_BANNED)


def banned_api(dotted: str) -> str | None:
    """The BANNED_APIS entry a dotted name falls under, or None."""
    if _allowed_exception(dotted):
        return None
    for prefix in BANNED_APIS:
        if prefix.endswith("_"):
            if dotted.startswith(prefix):
                return prefix
        elif dotted == prefix or dotted.startswith(prefix + "."):
            return prefix
    return None


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


class _Visitor(ast.NodeVisitor):
    """One pass over the module: import aliases first (module level and nested), then every use."""

    def __init__(self, banned_imports: list[str], banned_ops: set[str]):
        self.banned_imports = banned_imports
        self.banned_ops = banned_ops
        self.aliases: dict[str, str] = {}
        """Local name -> the dotted module or object it was imported as."""
        self.modules: set[str] = set()
        """Local names bound to an imported module (or an object from one): their attributes must not be set."""
        self.bound: set[str] = set()
        """Names the file binds itself (parameters, assignments): `input` as a parameter is not the builtin."""
        self.findings: list[Finding] = []
        self._jit_depth = 0

    def _add(self, rule: str, node: ast.AST, message: str) -> None:
        self.findings.append(Finding(rule, getattr(node, "lineno", 0), getattr(node, "col_offset", 0), message))

    def _check_module(self, module: str, node: ast.AST) -> None:
        hit = _matches(module, self.banned_imports)
        if hit:
            self._add("forbidden-import", node, f"import of {module!r} is forbidden for this task ({hit})")
        elif module.split(".")[0] not in ALLOWED_IMPORTS:
            self._add("import-not-allowed", node, f"import of {module!r} is not allowed in a candidate "
                                                  f"(allowed: {', '.join(ALLOWED_IMPORTS)})")
        elif banned_api(module):
            self._add("forbidden-api", node, f"{module} is off limits to a candidate ({banned_api(module)})")

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted name an expression refers to through the import aliases, or None."""
        dotted = _dotted(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head in self.aliases:
            return self.aliases[head] + ("." + rest if rest else "")
        return None

    def collect_aliases(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.arg):
                self.bound.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bound.add(node.name)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                        self.modules.add(alias.asname)
                    else:
                        head = alias.name.split(".")[0]
                        self.aliases[head] = head
                        self.modules.add(head)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    if alias.name != "*":
                        self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                        self.modules.add(alias.asname or alias.name)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self._add("import-not-allowed", node, "relative imports are not allowed in a candidate (one file)")
            return
        if not node.module:
            return
        before = len(self.findings)
        self._check_module(node.module, node)
        if len(self.findings) == before:
            for alias in node.names:
                if alias.name == "*":
                    self._add("import-not-allowed", node, f"'from {node.module} import *' hides what is used")
                    continue
                full = f"{node.module}.{alias.name}"
                hit = _matches(full, self.banned_imports)
                if hit:
                    self._add("forbidden-import", node, f"import of {full!r} is forbidden for this task ({hit})")
                elif banned_api(full):
                    self._add("forbidden-api", node, f"{full} is off limits to a candidate ({banned_api(full)})")
        if node.module == "torch" or node.module.startswith("torch."):
            for alias in node.names:
                if alias.name in self.banned_ops:
                    self._add("forbidden-torch-op", node, f"{node.module}.{alias.name} is a forbidden op for this task")

    def _is_jit(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            name = self.resolve(target) or _dotted(target) or ""
            if name == "triton" or name.startswith("triton."):
                return True
        return False

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._check_defaults(node.args)
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self._add("tensor-subclass", node, f"defining {node.name} intercepts torch calls (HARNESS.md C3)")
        jit = self._is_jit(node)
        self._jit_depth += jit
        self.generic_visit(node)
        self._jit_depth -= jit

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._check_defaults(node.args)
        self.generic_visit(node)

    def _check_defaults(self, args: ast.arguments) -> None:
        """A default bound to a parameter of the same name (open=open) would otherwise hide the builtin."""
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            if isinstance(default, ast.Name) and default.id in BANNED_BUILTINS and default.id not in self.aliases:
                self._add("forbidden-builtin", default, f"{default.id}() is not allowed in a candidate")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            full = self.resolve(base) or ""
            if full in TENSOR_TYPES:
                self._add("tensor-subclass", node, f"class {node.name} subclasses {full}; return a plain torch.Tensor")
        self.generic_visit(node)

    def visit_Try(self, node: ast.AST) -> None:
        self._add("try-except", node, "try/except is not allowed in a candidate: a fallback around a launch hides "
                                      "failures (HARNESS.md C4); let errors surface")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def _check_target(self, target: ast.AST) -> None:
        """Assignments through an imported name (time.perf_counter = ..., torch.Tensor.exp = ...) patch shared code."""
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._check_target(elt)
            return
        if isinstance(target, (ast.Attribute, ast.Subscript)):
            root = target
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            if isinstance(root, ast.Name) and root.id in self.modules:
                what = _dotted(target) or root.id
                self._add("patches-module", target, f"assigning to {what} modifies imported code (HARNESS.md H1)")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_target(target)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in BANNED_BUILTINS and node.id not in self.aliases and node.id not in self.bound:
            self._add("forbidden-builtin", node, f"{node.id}() is not allowed in a candidate")
        elif _is_dunder(node.id) and node.id not in ("__name__", "__file__", "__doc__"):
            self._add("dunder-access", node, f"{node.id} is not allowed in a candidate")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _is_dunder(node.attr):
            self._add("dunder-access", node, f"attribute {node.attr} is not allowed in a candidate")
            return
        if node.attr in BANNED_ATTRS:
            self._add("forbidden-api", node, f".{node.attr} is not allowed in a candidate")
            return
        full = self.resolve(node)
        if full and _allowed_exception(full):
            return  # its prefix (torch._C) is banned, and is only the way to this name
        if full:
            hit = banned_api(full)
            if hit:
                self._add("forbidden-api", node, f"{full} is off limits to a candidate ({hit})")
                return
            if node.attr in self.banned_ops and (full == "torch" or full.startswith("torch.")):
                self._add("forbidden-torch-op", node, f"{full} is a forbidden op for this task (write it in Triton)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = _dotted(func)
        resolved = self.resolve(func) or name
        if resolved in _IMPORT_CALLS or name in _IMPORT_CALLS:
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                self._check_module(node.args[0].value, node)
        if isinstance(func, ast.Name) and func.id in ("getattr", "hasattr") and func.id not in self.bound:
            attr = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
                self._add("dynamic-attr", node, f"{func.id}() with a computed name hides what is used; "
                                                "name the attribute")
            elif _is_dunder(attr.value) or attr.value in BANNED_ATTRS or attr.value in self.banned_ops:
                self._add("dynamic-attr", node, f"{func.id}(..., {attr.value!r}) is not allowed in a candidate")
        if isinstance(func, ast.Name) and func.id == "type" and len(node.args) == 3 and "type" not in self.bound:
            self._add("tensor-subclass", node, "type() with three arguments builds a class at run time")
        if isinstance(func, ast.Attribute) and func.attr in self.banned_ops and not self._jit_depth:
            receiver = self.resolve(func.value)
            if receiver is None:
                # Not a module we know, so most likely a tensor: x.softmax(-1), x.exp().
                self._add(
                    "forbidden-torch-op", node, f"tensor method .{func.attr}() is a forbidden op for this task"
                )
        self.generic_visit(node)


def jit_functions(tree: ast.AST) -> list[str]:
    """Names of the functions decorated with triton.jit (directly or under autotune/heuristics) in a module.

    These are the only GPU kernels a candidate's trace may contain besides memory set/copy: Triton names each
    compiled kernel after its function.
    """
    visitor = _Visitor([], set())
    visitor.collect_aliases(tree)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and visitor._is_jit(node):
            names.append(node.name)
    return sorted(set(names))


def check_static(task: "Task", source: str, filename: str = "<candidate>", tree: ast.AST | None = None) -> list[Finding]:
    """Check a candidate's source against the allowlist, the evaluator's bans and the task's forbidden lists.

    Args:
        task: the task whose [forbidden] lists apply.
        source: the candidate's source text.
        filename: used only for the SyntaxError a caller may see when `tree` is not given.
        tree: an already parsed module, to avoid parsing twice.

    Returns:
        Findings sorted by line; empty when the source passes.

    Raises:
        SyntaxError: the source does not parse (callers report it as a compile error first).
    """
    if tree is None:
        tree = pyast.parse(source, filename=filename)
    visitor = _Visitor(list(task.forbidden_imports), set(task.forbidden_torch_ops))
    visitor.collect_aliases(tree)
    visitor.visit(tree)
    unique: dict[tuple[int, int], Finding] = {}
    for f in visitor.findings:
        unique.setdefault((f.line, f.col), f)
    return sorted(unique.values(), key=lambda f: (f.line, f.col))
