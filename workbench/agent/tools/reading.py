"""Tools that read: the task, kernels, files, the attempt list, the best attempt, diffs, and Nsight Compute."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any, Mapping

from workbench.agent.evaluation import HELDOUT_DIR
from workbench.agent.prompts import attempt_line, goal_text
from workbench.agent.tools.base import Tool, ToolContext, ToolError, ToolOutcome, arguments, prop, text
from workbench.journal.events import Block
from workbench.session.revisions import changed, unified
from workbench.session.state import SessionState

MAX_FILE_CHARS = 100_000
"""Longest file read_file returns; a model context is no place for more."""

TASK_FILES = ("reference.py", "seed.py", "baseline.py")
"""Task-folder files the agent may read. task.toml is not among them: it lists the held-out shapes."""



def source_block(n: int) -> Block:
    """A reference to attempt n's source, expanded when the request is built (sources are journaled once)."""
    return {"type": "text", "source_of": n}


class ReadTask(Tool):
    name = "read_task"
    description = "The goal contract: task, shapes shown to the agent, tolerance, baseline, forbidden imports and ops."
    parameters = arguments()

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        return ToolOutcome(f"task {ctx.task.name}", {})

    def render(self, data: Mapping[str, Any], summary: str, state: SessionState) -> list[Block]:
        return [text(goal_text(state.goal))]


class _AttemptSource(Tool):
    """A tool whose result is one attempt's source (read_kernel, show_best)."""

    def render(self, data: Mapping[str, Any], summary: str, state: SessionState) -> list[Block]:
        n = data.get("attempt")
        if n is None:
            if "text" in data:
                what = f"starting kernel {Path(state.start_file).name}" if state.start_file else "seed kernel"
                return [text(f"{what} (no attempt written yet):"), text(data["text"])]
            return [text(summary or "no attempt yet")]
        attempt = state.attempts.get(n)
        head = attempt_line(attempt) if attempt else f"attempt {n}"
        return [text(f"attempt {n}: {head}\nsource:"), source_block(n)]


class ReadKernel(_AttemptSource):
    name = "read_kernel"
    description = "The source of an attempt (default: the latest; the seed before any attempt)."
    parameters = arguments(attempt=prop("integer", "Attempt number.", minimum=1))

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        n = args.get("attempt") or (ctx.state.current.n if ctx.state.current else None)
        if n is None:
            # No attempt holds the seed yet, so its text is journaled with the result.
            return ToolOutcome("seed kernel", {"attempt": None, "text": ctx.seed_source})
        ctx.attempt(n, self.name)
        return ToolOutcome(f"attempt {n} source", {"attempt": n})


class ShowBest(_AttemptSource):
    name = "show_best"
    description = "The best attempt so far, with its source."
    parameters = arguments()

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        best = ctx.state.best_attempt
        if best is None:
            return ToolOutcome("no correct attempt yet", {"attempt": None})
        return ToolOutcome(f"best: attempt {best.n}", {"attempt": best.n})


def confined_path(path: str, roots: list[tuple[Path, tuple[str, ...] | None]]) -> Path:
    """Resolve a relative path inside one of `roots`, refusing anything that could leave them.

    Args:
        path: what the agent asked for, relative ('reference.py', 'attempts/0003/diff.patch').
        roots: (folder, allowed top-level names or None for any) in order of preference.

    Raises:
        ToolError: absolute, '..', a symlink (or any path) resolving outside its root, or not an allowed file.
    """
    rel = PurePosixPath(path.replace("\\", "/"))
    if not path.strip() or rel.is_absolute() or ".." in rel.parts or path.startswith("~"):
        raise ToolError(f"read_file: {path!r} must be a relative path inside the task or session folder")
    if rel.parts and rel.parts[0] == HELDOUT_DIR:
        raise ToolError("read_file: held-out results are hidden from the agent")
    for root, allowed in roots:
        if allowed is not None and str(rel) not in allowed:
            continue
        base = root.resolve()
        target = (base / rel).resolve()
        if not target.is_relative_to(base):
            raise ToolError(f"read_file: {path!r} leads outside its folder (a symlink out is refused)")
        if target.is_file():
            return target
    raise ToolError(f"read_file: no readable file {path!r} (task files: {', '.join(TASK_FILES)}; session files "
                    "such as attempts/0001/kernel.py)")


class ReadFile(Tool):
    name = "read_file"
    description = ("Read a file of the task (reference.py, seed.py, baseline.py) or of this session "
                   "(e.g. attempts/0003/diff.patch, attempts/0003/result.json). Relative paths only.")
    parameters = arguments(("path",), path=prop("string", "Relative path."))

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        target = confined_path(args["path"], [(Path(ctx.task.dir), TASK_FILES), (ctx.session_dir, None)])
        try:
            content = target.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ToolError(f"read_file: cannot read {args['path']!r}: {exc.strerror}") from None
        cut = f" (first {MAX_FILE_CHARS} of {len(content)} chars)" if len(content) > MAX_FILE_CHARS else ""
        return ToolOutcome(f"{args['path']}: {len(content)} chars{cut}",
                           {"path": args["path"], "text": content[:MAX_FILE_CHARS]})

    def render(self, data: Mapping[str, Any], summary: str, state: SessionState) -> list[Block]:
        return [text(f"{data.get('path')}:"), text(data.get("text", ""))]


class ListAttempts(Tool):
    name = "list_attempts"
    description = "The latest attempts, one line each: parent, verdict, speedup, strategy and note."
    parameters = arguments(last=prop("integer", "How many (default 20).", minimum=1))

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        last = args.get("last", 20)
        upto = ctx.state.current.n if ctx.state.current else 0
        count = len(ctx.state.attempts)
        return ToolOutcome(f"latest {min(last, count)} of {count} attempts", {"last": last, "upto": upto})

    def render(self, data: Mapping[str, Any], summary: str, state: SessionState) -> list[Block]:
        # Rendered from the state as of the request, up to the attempt that was latest when the tool ran.
        upto, last = data.get("upto", 0), data.get("last", 20)
        rows = [state.attempts[n] for n in sorted(state.attempts) if n <= upto][-last:]
        listed = "\n".join(attempt_line(a) for a in rows) or "no attempts yet"
        return [text(f"{summary}\n{listed}")]


class DiffAttempts(Tool):
    name = "diff_attempts"
    description = "Unified diff between two attempts."
    parameters = arguments(("a", "b"), a=prop("integer", "From attempt.", minimum=1),
                           b=prop("integer", "To attempt.", minimum=1))

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        a, b = ctx.attempt(args["a"], self.name), ctx.attempt(args["b"], self.name)
        added, removed = changed(a.source, b.source)
        return ToolOutcome(f"diff {a.n} -> {b.n}: +{added} -{removed} lines",
                           {"a": a.n, "b": b.n, "added": added, "removed": removed})

    def render(self, data: Mapping[str, Any], summary: str, state: SessionState) -> list[Block]:
        a, b = state.attempts.get(data.get("a")), state.attempts.get(data.get("b"))  # type: ignore[arg-type]
        if a is None or b is None:
            return [text(summary)]
        diff = unified(a.source, b.source, f"attempt {a.n}", f"attempt {b.n}")
        return [text(diff or f"attempts {a.n} and {b.n} are identical")]


class Profile(Tool):
    name = "profile"
    description = ("Nsight Compute on one shape of an attempt (default: the best): DRAM/L2/SM throughput, occupancy, "
                   "registers, shared memory, L2 hit rate and bytes, stall reasons. CUDA sessions only; every "
                   "evaluation on CUDA already carries a kernel table and roofline class.")
    parameters = arguments(attempt=prop("integer", "Attempt number (default: the best).", minimum=1),
                           shape=prop("string", "A shape name (default: the first benchmark shape)."))

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        state = ctx.state
        n = args.get("attempt") or state.best or (state.current.n if state.current else None)
        if n is None or n not in state.attempts:
            raise ToolError("profile: no attempt to profile yet" if n is None else f"profile: no attempt {n}")
        if ctx.device != "cuda":
            raise ToolError(f"profile: Nsight Compute needs a CUDA device; this session evaluates on {ctx.device} "
                            "(the Triton interpreter has no hardware counters)")
        shapes = [s.name for s in ctx.task.shapes.get("cuda", [])]
        shape = args.get("shape") or shapes[0]
        if shape not in shapes:
            raise ToolError(f"profile: unknown shape {shape!r} (shapes: {', '.join(shapes)})")
        from workbench.profiler import ncu

        try:
            run = ncu.run(ctx.task.name, ctx.attempt_path(n), shape)
        except ncu.NcuError as exc:
            raise ToolError(f"profile: {exc}") from exc
        metrics = {k: v for k, v in run.items() if k != "csv"}
        ctx.emit("profile.finished", {"attempt": n, "source": "ncu", "ncu": metrics})
        return ToolOutcome(f"attempt {n}: Nsight Compute on {shape}, {run.get('launches', 0)} launches",
                           {"attempt": n, "ncu": metrics})

