"""Read and rewrite the TUNABLES/CONFIG literals a kernel declares, without executing the kernel."""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from typing import Any, Iterator

from workbench import pyast


class TunablesError(ValueError):
    """The kernel declares no usable TUNABLES/CONFIG (message names the line)."""


@dataclass(frozen=True)
class Declared:
    """What a kernel declares: the search space and the current choice, plus where CONFIG sits in the source."""

    space: dict[str, list[Any]]
    config: dict[str, Any]
    config_span: tuple[int, int, int, int]
    """(lineno, col_offset, end_lineno, end_col_offset) of the CONFIG dict literal."""


def _literal_assign(tree: ast.Module, name: str) -> ast.Assign | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == name:
                return node
    return None


def read_declared(source: str) -> Declared:
    """Parse TUNABLES (name -> list of values) and CONFIG (name -> value) from a kernel's source.

    Raises:
        TunablesError: either is missing, not a literal, or CONFIG names a value outside TUNABLES.
    """
    try:
        tree = pyast.parse(source)
    except SyntaxError as exc:
        raise TunablesError(f"line {exc.lineno}: {exc.msg}") from exc
    found = {}
    for name in ("TUNABLES", "CONFIG"):
        node = _literal_assign(tree, name)
        if node is None:
            raise TunablesError(f"no module-level {name} = {{...}} literal")
        try:
            found[name] = (node, ast.literal_eval(node.value))
        except ValueError as exc:
            raise TunablesError(f"line {node.lineno}: {name} must be a literal dict") from exc
        if not isinstance(found[name][1], dict):
            raise TunablesError(f"line {node.lineno}: {name} must be a dict")
    space, config = found["TUNABLES"][1], found["CONFIG"][1]
    for key, values in space.items():
        if not isinstance(values, list) or not values:
            raise TunablesError(f"TUNABLES[{key!r}] must be a non-empty list")
    for key, value in config.items():
        if key in space and value not in space[key]:
            raise TunablesError(f"CONFIG[{key!r}] = {value!r} is not one of TUNABLES[{key!r}]")
    value_node = found["CONFIG"][0].value
    span = (value_node.lineno, value_node.col_offset, value_node.end_lineno, value_node.end_col_offset)
    return Declared(space=space, config=config, config_span=span)  # type: ignore[arg-type]


def with_config(source: str, config: dict[str, Any]) -> str:
    """Return `source` with its CONFIG literal replaced by `config`; everything else byte-identical."""
    declared = read_declared(source)
    lineno, col, end_lineno, end_col = declared.config_span
    lines = source.splitlines(keepends=True)
    literal = "{" + ", ".join(f"{key!r}: {value!r}" for key, value in config.items()) + "}"
    head = "".join(lines[: lineno - 1]) + lines[lineno - 1][:col]
    tail = lines[end_lineno - 1][end_col:] + "".join(lines[end_lineno:])
    return head + literal + tail


def grid(space: dict[str, list[Any]]) -> Iterator[dict[str, Any]]:
    """Every combination of the space, in declaration order."""
    keys = list(space)
    for values in itertools.product(*(space[k] for k in keys)):
        yield dict(zip(keys, values))


def neighbours(space: dict[str, list[Any]], config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Configs one step away from `config` along one parameter (nearest values first)."""
    for key, values in space.items():
        if key not in config or config[key] not in values:
            continue
        i = values.index(config[key])
        for j in sorted(range(len(values)), key=lambda j: (abs(j - i), j)):
            if j != i:
                yield {**config, key: values[j]}


def config_key(config: dict[str, Any]) -> tuple:
    """A hashable identity for a config (order-independent)."""
    return tuple(sorted((k, repr(v)) for k, v in config.items()))
