"""Turn an exception raised by candidate code into a verdict and a one-line message with the candidate's file:line."""

from __future__ import annotations

import traceback
from types import ModuleType
from typing import Any

_CUDA_MARKERS = ("CUDA error", "CUDA_ERROR", "cudaError", "device-side assert", "illegal memory access")
_TRITON_COMPILE_TYPES = ("CompilationError", "InterpreterError", "OutOfResources", "CompileTimeAssertionFailure")
"""Triton exception types that mean "this kernel cannot be built or launched as written"."""


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out and len(out) < 16:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return out


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-empty line of an exception's text, trimmed (messages stay one line)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def _candidate_line(exc: BaseException, candidate_file: str) -> int | None:
    """The innermost line of the candidate file in this exception's traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    lines = [f.lineno for f in frames if f.filename == candidate_file and f.lineno]
    return lines[-1] if lines else None


def _jit_def_lines(module: ModuleType | None) -> dict[str, int]:
    """Map each @triton.jit function's source text to the file line of its `def`, for CompilationError offsets."""
    found: dict[str, int] = {}
    if module is None:
        return found
    for obj in list(vars(module).values()):
        fn: Any = obj
        for _ in range(8):  # unwrap autotune/heuristics wrappers down to the JITFunction
            if hasattr(fn, "raw_src") and hasattr(fn, "starting_line_number"):
                break
            fn = getattr(fn, "fn", None)
        if fn is None or not hasattr(fn, "raw_src"):
            continue
        src = getattr(fn, "src", None) or getattr(fn, "_src", None)
        if not isinstance(src, str):
            continue
        offset = next((i for i, line in enumerate(fn.raw_src) if line.lstrip().startswith("def ")), 0)
        found[src] = fn.starting_line_number + offset
    return found


def _is_cuda_fault(chain: list[BaseException]) -> bool:
    for exc in chain:
        if type(exc).__name__ == "AcceleratorError":
            return True
        text = str(exc)
        if any(marker in text for marker in _CUDA_MARKERS):
            return True
    return False


def classify(exc: BaseException, candidate_file: str, display: str, module: ModuleType | None = None) -> dict[str, Any]:
    """Classify an exception from loading or calling the candidate.

    Args:
        exc: the exception.
        candidate_file: the path the candidate was loaded from (as it appears in tracebacks).
        display: the path to show people instead (the agent's file, not the evaluator's private copy).
        module: the loaded candidate module, to map Triton compile errors onto kernel lines.

    Returns:
        {"verdict": "compile_error" | "crash", "message": "<display>:<line>: <Type>: <text>", "fatal": bool}.
        "fatal" is true after a CUDA fault: the context is unusable and the worker must exit.
    """
    chain = _chain(exc)
    names = {type(e).__name__ for e in chain}
    line = None
    detail = exc
    compile_error = bool(names & set(_TRITON_COMPILE_TYPES))
    for e in chain:
        if type(e).__name__ in ("CompilationError", "CompileTimeAssertionFailure", "UnsupportedLanguageConstruct"):
            src, node = getattr(e, "src", None), getattr(e, "node", None)
            def_line = _jit_def_lines(module).get(src) if isinstance(src, str) else None
            if def_line is not None and getattr(node, "lineno", None):
                line = def_line + node.lineno - 1
            reason = getattr(e, "error_message", None) or (e.__cause__ and repr(e.__cause__)) or type(e).__name__
            text = next((ln.strip() for ln in str(reason).splitlines() if ln.strip()), type(e).__name__)
            message = f"Triton compile error: {text[:300]}"
            break
    else:
        # The deepest cause carries the kernel line under the interpreter (InterpreterError wraps it).
        for e in reversed(chain):
            line = _candidate_line(e, candidate_file)
            if line is not None:
                detail = e
                break
        kind = "Triton error" if compile_error else type(detail).__name__
        if compile_error and type(detail).__name__ not in _TRITON_COMPILE_TYPES:
            kind = f"Triton error: {type(detail).__name__}"
        message = f"{kind}: {first_line(detail)}".rstrip(": ")
    if line is None:
        line = next((ln for e in reversed(chain) if (ln := _candidate_line(e, candidate_file))), None)
    fatal = _is_cuda_fault(chain)
    if fatal:
        compile_error = False
        message = f"CUDA fault: {first_line(next(e for e in chain if _is_cuda_fault([e])))}"
    where = f"{display}:{line}" if line else display
    return {"verdict": "compile_error" if compile_error else "crash", "message": f"{where}: {message}", "fatal": fatal}
