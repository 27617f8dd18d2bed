"""No import cycles among workbench modules, counting function-level (lazy) and TYPE_CHECKING imports.

The graph is built from the source with `ast`, not by importing: an import inside a function or under
TYPE_CHECKING is a dependency all the same, and a cycle through one is a design that only works by the order
things happen to load in.
"""

from __future__ import annotations

import ast
from pathlib import Path

import workbench

PACKAGE = Path(workbench.__file__).resolve().parent
SKIPPED = ("workbench.evaluator.selftest_cases",)
"""Known-bad kernels the self-test evaluates: data, not modules of the program."""

KNOWN: set[frozenset[str]] = set()
"""Cycles left for their owners, each with its issue (none today: the evaluator and profiler have no cycle)."""


def module_names() -> dict[str, Path]:
    """Every workbench module: dotted name -> file (a package is its __init__)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if not name.startswith(SKIPPED):
            out[name] = path
    return out


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The workbench modules `name` imports anywhere in its file.

    `from pkg import sub` where sub is a submodule is an edge to pkg.sub (not to pkg's __init__); `from pkg import
    x` of anything else is an edge to pkg; `import a.b.c` is an edge to a.b.c.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in modules:
                    edges.add(sub)
                elif source in modules:
                    edges.add(source)
    edges.discard(name)
    return edges


def graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_path_through(sorted(component), edges))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _path_through(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One cycle inside a strongly connected component, as a -> b -> ... -> a (for the failure message)."""
    members = set(component)
    start = component[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in edges[path[-1]] if w in members)
        back = [w for w in nxt if w == start]
        if back and len(path) > 1:
            return path + [start]
        fresh = [w for w in nxt if w not in seen]
        if not fresh:
            return path + [nxt[0]] if nxt else path
        path.append(fresh[0])
        seen.add(fresh[0])


def test_the_graph_sees_lazy_and_type_checking_imports():
    edges = graph()
    # cli imports every command's module inside the command's function only
    assert "workbench.agent.runtime" in edges["workbench.cli"]
    # a TYPE_CHECKING import is an edge too
    assert "workbench.session.store" in edges["workbench.agent.runtime"]
    # `from workbench.agent.tools import TOOLS` is an edge to the package, `from workbench.agent import ledger` to
    # the submodule
    assert "workbench.agent.tools" in edges["workbench.agent.runtime"]
    assert "workbench.agent.ledger" in edges["workbench.agent.tools.writing"]
    assert "workbench.agent" not in edges["workbench.agent.tools.writing"]


def test_cycles_are_found_and_named():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_among_workbench_modules():
    found = [c for c in cycles(graph()) if frozenset(c) not in KNOWN]
    assert not found, "import cycles (one path through each group of modules that import each other): " + \
        "; ".join(" -> ".join(c) for c in found)
