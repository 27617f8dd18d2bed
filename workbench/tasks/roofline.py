"""Safe evaluation of the roofline FLOP and byte formulas a task.toml declares."""

from __future__ import annotations

import ast
import math
from typing import Any, Mapping

from workbench import pyast

DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
"""Element sizes of the dtypes a shape's params may name (``dtype = "bfloat16"``)."""

SIZE_NAMES: dict[str, int] = {"fp64": 8, "fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int64": 8, "int32": 4}
"""Short dtype-size names every formula may use, so ``bytes = "2 * fp32 * rows * cols"`` reads as intended."""

FUNCTIONS = {
    "min": min,
    "max": max,
    "ceil": math.ceil,
    "floor": math.floor,
    "cdiv": lambda a, b: -(-a // b),
}
"""The only calls a formula may make: pure, cheap and total on numbers."""

_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}
_UNARY = {ast.UAdd: lambda a: +a, ast.USub: lambda a: -a}
_MAX_EXPONENT = 64
"""Bounds `**` so a formula cannot make the loader build an astronomically large integer."""


class ExpressionError(ValueError):
    """A formula that is not plain arithmetic, names an unknown value, or cannot be evaluated."""


def parse(expr: str) -> ast.Expression:
    """Parse a formula and check that it uses only arithmetic, numbers, names and the allowed functions.

    Raises:
        ExpressionError: a syntax error or any construct outside that set (attributes, subscripts, lambdas...).
    """
    if not isinstance(expr, str) or not expr.strip():
        raise ExpressionError("must be a non-empty string")
    try:
        tree = pyast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"invalid expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.Load)) or type(node) in _BINOPS or type(node) in _UNARY:
            continue
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Name)):
            continue
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise ExpressionError(f"only numeric constants are allowed, got {node.value!r}")
            continue
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
                raise ExpressionError(f"only calls to {', '.join(sorted(FUNCTIONS))} with positional arguments")
            continue
        raise ExpressionError(f"{type(node).__name__} is not allowed (arithmetic only)")
    return tree


def names(params: Mapping[str, Any]) -> dict[str, float | int]:
    """The values a formula can use for one shape: numeric params, bools as 0/1, dtype sizes.

    A string param naming a dtype (``dtype = "bfloat16"``) adds ``<param>_bytes`` (here ``dtype_bytes = 2``).
    """
    scope: dict[str, float | int] = dict(SIZE_NAMES)
    for key, value in params.items():
        if isinstance(value, bool):
            scope[key] = int(value)
        elif isinstance(value, (int, float)):
            scope[key] = value
        elif isinstance(value, str) and value in DTYPE_BYTES:
            scope[f"{key}_bytes"] = DTYPE_BYTES[value]
    return scope


def evaluate(tree: ast.Expression, scope: Mapping[str, float | int]) -> float:
    """Evaluate a parsed formula over `scope`.

    Raises:
        ExpressionError: an unknown name, a division by zero, a huge exponent, or a negative/non-finite result.
    """

    def ev(node: ast.AST) -> float | int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in FUNCTIONS:
                raise ExpressionError(f"{node.id!r} is a function, not a value")
            if node.id not in scope:
                raise ExpressionError(f"unknown name {node.id!r}")
            return scope[node.id]
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](ev(node.operand))
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
                raise ExpressionError(f"exponent {right} is larger than {_MAX_EXPONENT}")
            try:
                return _BINOPS[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ExpressionError("division by zero") from None
            except OverflowError:
                raise ExpressionError("overflow") from None
        if isinstance(node, ast.Call):
            args = [ev(a) for a in node.args]
            try:
                return FUNCTIONS[node.func.id](*args)  # type: ignore[union-attr]
            except (TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
                raise ExpressionError(f"{node.func.id}(): {exc}") from None  # type: ignore[union-attr]
        raise ExpressionError(f"{type(node).__name__} is not allowed")

    value = ev(tree)
    try:
        result = float(value)  # a complex (negative base, fractional power) raises TypeError here
    except (TypeError, OverflowError):
        result = math.nan
    if not math.isfinite(result) or result < 0:
        raise ExpressionError(f"evaluates to {value!r}; a count must be finite and non-negative")
    return result
