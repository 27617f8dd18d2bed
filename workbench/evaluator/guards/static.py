"""Static checks on a candidate's source: forbidden imports and forbidden torch ops, each with its line."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from workbench.tasks import Task

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


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class _Visitor(ast.NodeVisitor):
    """One pass over the module: import aliases first (module level and nested), then every use."""

    def __init__(self, banned_imports: list[str], banned_ops: set[str]):
        self.banned_imports = banned_imports
        self.banned_ops = banned_ops
        self.aliases: dict[str, str] = {}
        """Local name -> the dotted module or object it was imported as."""
        self.findings: list[Finding] = []
        self._jit_depth = 0

    def _add(self, rule: str, node: ast.AST, message: str) -> None:
        self.findings.append(Finding(rule, getattr(node, "lineno", 0), getattr(node, "col_offset", 0), message))

    def _check_module(self, module: str, node: ast.AST) -> None:
        hit = _matches(module, self.banned_imports)
        if hit:
            self._add("forbidden-import", node, f"import of {module!r} is forbidden for this task ({hit})")

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
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        head = alias.name.split(".")[0]
                        self.aliases[head] = head
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    if alias.name != "*":
                        self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return
        before = len(self.findings)
        self._check_module(node.module, node)
        if len(self.findings) == before:
            for alias in node.names:
                self._check_module(f"{node.module}.{alias.name}", node)
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
        jit = self._is_jit(node)
        self._jit_depth += jit
        self.generic_visit(node)
        self._jit_depth -= jit

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in self.banned_ops:
            full = self.resolve(node)
            if full and (full == "torch" or full.startswith("torch.")):
                self._add("forbidden-torch-op", node, f"{full} is a forbidden op for this task (write it in Triton)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = _dotted(func)
        resolved = self.resolve(func) or name
        if resolved in _IMPORT_CALLS or name in _IMPORT_CALLS:
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                self._check_module(node.args[0].value, node)
        if isinstance(func, ast.Attribute) and func.attr in self.banned_ops and not self._jit_depth:
            receiver = self.resolve(func.value)
            if receiver is None:
                # Not a module we know, so most likely a tensor: x.softmax(-1), x.exp().
                self._add(
                    "forbidden-torch-op", node, f"tensor method .{func.attr}() is a forbidden op for this task"
                )
        self.generic_visit(node)


def check_static(task: "Task", source: str, filename: str = "<candidate>", tree: ast.AST | None = None) -> list[Finding]:
    """Check a candidate's source against the task's forbidden imports and torch ops.

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
        tree = ast.parse(source, filename=filename)
    visitor = _Visitor(list(task.forbidden_imports), set(task.forbidden_torch_ops))
    visitor.collect_aliases(tree)
    visitor.visit(tree)
    unique = {(f.line, f.col, f.rule, f.message): f for f in visitor.findings}
    return sorted(unique.values(), key=lambda f: (f.line, f.col))
