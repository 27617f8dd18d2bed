"""Python source parsed into an AST, one parse at a time in the process.

CPython 3.11 counts the AST converter's recursion depth in interpreter-wide state. When a garbage collection in
the middle of one thread's conversion lets another thread parse, the count comes back wrong and `ast.parse` raises
"SystemError: AST constructor recursion depth mismatch". The evaluation pool's slots each check their candidate in
a thread of their own, and one such error failed a job in tests/test_fleet_slots.py (2026-12-02, Python 3.11.7).
Three threads parsing beside a fourth that makes cyclic garbage with finalizers reproduce it in about 120
parses. So every parse in workbench goes through here and takes its turn.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """ast.parse(source, filename, mode), never at the same time as another thread's."""
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)
