"""The tools an agent calls: schemas, argument checks, and their effects on the session (always journaled)."""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable

from workbench.agent import ledger as ledger_mod

if TYPE_CHECKING:
    from workbench.agent.runtime import AgentRuntime


class ToolError(Exception):
    """A bad call: the agent gets this message as the tool's result, the run goes on."""


@dataclass
class ToolOutcome:
    """What a tool returns: a one-line summary for logs and the data the backend reads.

    The runtime journals `data` without its bulky keys ('result', 'source', 'task'), which the journal already
    holds elsewhere (eval.finished, attempt.written, goal.set); everything else must be enough to render the
    result for a model again after a restart.
    """

    summary: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Tool:
    """A tool: JSON schema of its arguments (the shape an LLM backend is shown) and its implementation."""

    name: str
    description: str
    schema: dict[str, Any]
    run: Callable[["AgentRuntime", dict[str, Any]], ToolOutcome]


_TYPES = {"string": str, "integer": int, "object": dict, "number": (int, float), "boolean": bool, "array": list}

MAX_FILE_CHARS = 100_000
"""Longest file read_file returns; a model context is no place for more."""

TASK_FILES = ("reference.py", "seed.py", "baseline.py")
"""Task-folder files the agent may read. task.toml is not among them: it lists the held-out shapes."""


def _check_value(where: str, spec: dict[str, Any], value: Any) -> None:
    expected = _TYPES[spec["type"]]
    if isinstance(value, bool) and expected is not bool or not isinstance(value, expected):
        raise ToolError(f"{where} must be {spec['type']}, not {type(value).__name__}")
    if "enum" in spec and value not in spec["enum"]:
        raise ToolError(f"{where} must be one of {', '.join(map(str, spec['enum']))}, not {value!r}")
    if "minimum" in spec and value < spec["minimum"]:
        raise ToolError(f"{where} must be >= {spec['minimum']}, not {value!r}")
    if spec["type"] == "array" and "items" in spec:
        for i, item in enumerate(value):
            _check_value(f"{where}[{i}]", spec["items"], item)


def check_args(tool: Tool, args: Any) -> dict[str, Any]:
    """Validate arguments against the tool's (flat) schema.

    Raises:
        ToolError: not an object, a required argument missing, an unknown argument, a wrong type or a value
            outside its enum or minimum.
    """
    if not isinstance(args, dict):
        raise ToolError(f"{tool.name}: arguments must be an object")
    props = tool.schema.get("properties", {})
    for name in tool.schema.get("required", []):
        if name not in args:
            raise ToolError(f"{tool.name}: missing argument {name!r}")
    for name, value in args.items():
        if name not in props:
            raise ToolError(f"{tool.name}: unknown argument {name!r} (takes {', '.join(props) or 'no arguments'})")
        _check_value(f"{tool.name}: {name}", props[name], value)
    if tool.schema.get("oneOf"):
        if not any(all(k in args for k in choice["required"]) for choice in tool.schema["oneOf"]):
            options = " or ".join("+".join(c["required"]) for c in tool.schema["oneOf"])
            raise ToolError(f"{tool.name}: give {options}")
    return args


def sha256_text(text: str) -> str:
    """Hex sha256 of text as UTF-8: ties every result to the exact code evaluated."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- reading -----------------------------------------------------------------------------------------
def _read_task(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    return ToolOutcome(f"task {rt.task.name}", {"task": rt.task.public_view()})


def _attempt(rt: "AgentRuntime", n: int, tool: str):
    attempt = rt.state.attempts.get(n)
    if attempt is None:
        last = rt.state.next_attempt - 1
        raise ToolError(f"{tool}: no attempt {n} (" + (f"attempts 1-{last})" if last else "no attempts yet)"))
    return attempt


def _read_kernel(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    n = args.get("attempt") or (rt.state.current.n if rt.state.current else None)
    if n is None:
        seed = rt.backend_seed_source()
        # No attempt holds the seed yet, so its text is journaled with the result.
        return ToolOutcome("seed kernel", {"attempt": None, "source": seed, "text": seed})
    attempt = _attempt(rt, n, "read_kernel")
    return ToolOutcome(f"attempt {n} source", {"attempt": n, "source": attempt.source})


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
    if rel.parts and rel.parts[0] == "heldout":
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


def _read_file(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    roots: list[tuple[Path, tuple[str, ...] | None]] = []
    task_dir = getattr(rt.task, "dir", None)
    if task_dir is not None:
        roots.append((Path(task_dir), TASK_FILES))
    roots.append((Path(rt.files.dir), None))
    target = confined_path(args["path"], roots)
    try:
        text = target.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ToolError(f"read_file: cannot read {args['path']!r}: {exc.strerror}") from None
    cut = f" (first {MAX_FILE_CHARS} of {len(text)} chars)" if len(text) > MAX_FILE_CHARS else ""
    return ToolOutcome(f"{args['path']}: {len(text)} chars{cut}", {"path": args["path"], "text": text[:MAX_FILE_CHARS]})


def _list_attempts(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    last = args.get("last", 20)
    upto = rt.state.current.n if rt.state.current else 0
    count = len(rt.state.attempts)
    return ToolOutcome(f"latest {min(last, count)} of {count} attempts", {"last": last, "upto": upto})


def _profile(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    n = args.get("attempt") or rt.state.best or (rt.state.current.n if rt.state.current else None)
    if n is None or n not in rt.state.attempts:
        raise ToolError("profile: no attempt to profile yet" if n is None else f"profile: no attempt {n}")
    if rt.device != "cuda":
        raise ToolError(f"profile: Nsight Compute needs a CUDA device; this session evaluates on {rt.device} "
                        "(the Triton interpreter has no hardware counters)")
    shapes = [s.name for s in rt.task.shapes.get("cuda", [])]
    shape = args.get("shape") or shapes[0]
    if shape not in shapes:
        raise ToolError(f"profile: unknown shape {shape!r} (shapes: {', '.join(shapes)})")
    from workbench.profiler import ncu

    try:
        run = ncu.run(rt.task.name, rt.attempt_path(n), shape)
    except ncu.NcuError as exc:
        raise ToolError(f"profile: {exc}") from exc
    data = {"attempt": n, "source": "ncu", "ncu": {k: v for k, v in run.items() if k != "csv"}}
    rt.emit("profile.finished", data)
    return ToolOutcome(f"attempt {n}: Nsight Compute on {shape}, {run.get('launches', 0)} launches", data)


def _show_best(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    best = rt.state.best_attempt
    if best is None:
        return ToolOutcome("no correct attempt yet", {"attempt": None})
    return ToolOutcome(f"best: attempt {best.n}", {"attempt": best.n, "source": best.source})


def _diff_attempts(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    a, b = _attempt(rt, args["a"], "diff_attempts"), _attempt(rt, args["b"], "diff_attempts")
    added = removed = 0
    for line in difflib.unified_diff(a.source.splitlines(), b.source.splitlines(), lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return ToolOutcome(f"diff {a.n} -> {b.n}: +{added} -{removed} lines",
                       {"a": a.n, "b": b.n, "added": added, "removed": removed})


# -- writing -----------------------------------------------------------------------------------------
def _strategy_tag(rt: "AgentRuntime", args: dict[str, Any], tool: str) -> dict[str, Any]:
    sid = args.get("strategy")
    if not sid:
        return {}
    entry = ledger_mod.find(rt.state.ledger, sid)
    if entry is None:
        known = ", ".join(e["id"] for e in rt.state.ledger) or "none yet"
        raise ToolError(f"{tool}: no strategy {sid!r} in the ledger (ids: {known}); add it with the ledger tool first")
    return {"strategy": entry["id"]}


def _new_attempt(rt: "AgentRuntime", source: str, *, parent: int | None, note: str, params: dict[str, Any],
                 tool: str) -> ToolOutcome:
    sha = sha256_text(source)
    for other in rt.state.attempts.values():
        if other.sha256 == sha:
            raise ToolError(f"{tool}: identical to attempt {other.n} ({other.verdict or 'not evaluated'}); "
                            "evaluate that one or change something")
    n = rt.write_attempt(source, note=note, params=params, parent=parent)
    attempt = rt.state.attempts[n]
    warnings = ledger_mod.find_repeats(rt.state, attempt)
    parent_text = f"parent #{parent}" if parent is not None else "from the seed"
    base = rt.state.attempts[parent].source if parent is not None else rt.backend_seed_source()
    changed = sum(1 for line in difflib.ndiff(base.splitlines(), source.splitlines()) if line[:1] in "+-")
    summary = f"attempt {n} written ({parent_text}, {changed} lines changed); evaluate it to measure"
    return ToolOutcome(summary, {"attempt": n, "parent": parent, "warnings": warnings})


def _write_kernel(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    params = _strategy_tag(rt, args, "write_kernel")
    parent = args.get("parent", rt.state.current.n if rt.state.current else None)
    if parent is not None:
        _attempt(rt, parent, "write_kernel")
    if not args["source"].strip():
        raise ToolError("write_kernel: source is empty")
    return _new_attempt(rt, args["source"], parent=parent, note=args.get("note", ""), params=params,
                        tool="write_kernel")


def _edit_kernel(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    params = _strategy_tag(rt, args, "edit_kernel")
    base_n = args.get("attempt") or (rt.state.current.n if rt.state.current else None)
    source = _attempt(rt, base_n, "edit_kernel").source if base_n is not None else rt.backend_seed_source()
    where = f"attempt {base_n}" if base_n is not None else "the seed"
    search = args["search"]
    if not search:
        raise ToolError("edit_kernel: search is empty")
    count = source.count(search)
    if count == 0:
        raise ToolError(f"edit_kernel: search text not found in {where} (it must match exactly, whitespace "
                        "included; read_kernel shows the source)")
    if count > 1:
        raise ToolError(f"edit_kernel: search text occurs {count} times in {where}; include more surrounding "
                        "lines so it matches exactly once")
    new = source.replace(search, args["replace"], 1)
    if new == source:
        raise ToolError("edit_kernel: the replacement changes nothing")
    return _new_attempt(rt, new, parent=base_n, note=args.get("note", ""), params=params, tool="edit_kernel")


def _report(result: dict[str, Any]) -> dict[str, Any]:
    """The evaluator's result cut to what the agent acts on (the full result is in eval.finished)."""
    keys = ("name", "correct", "rel_err", "ms", "baseline_ms", "speedup", "floor_ms", "graph_ms", "baseline_graph_ms",
            "graph_speedup")
    return {
        "verdict": result.get("verdict"),
        "message": result.get("message", ""),
        "speedup": result.get("speedup"),
        "timing_comparable": bool(result.get("timing_comparable")),
        "shapes": [{k: s[k] for k in keys if s.get(k) is not None} for s in result.get("shapes", [])],
    }


def _evaluate(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    if "source" in args:
        source = args["source"]
        parent = args.get("parent", rt.state.best)
        if parent is not None and parent not in rt.state.attempts:
            raise ToolError(f"evaluate: parent attempt {parent} does not exist")
        params = {**(args.get("params") or {}), **_strategy_tag(rt, args, "evaluate")}
        n = rt.write_attempt(source, note=args.get("note", ""), params=params, parent=parent)
    else:
        n = args.get("attempt") or (rt.state.current.n if rt.state.current else None)
        if n is None:
            raise ToolError("evaluate: nothing to evaluate yet; write_kernel or edit_kernel first")
        _attempt(rt, n, "evaluate")
    attempt = rt.state.attempts[n]
    warnings = ledger_mod.find_repeats(rt.state, attempt)
    if warnings and not args.get("force"):
        raise ToolError(f"evaluate: attempt {n} not evaluated: " + " / ".join(w["message"] for w in warnings)
                        + ". If this try differs for a reason the ledger does not show, pass force=true.")
    result = rt.evaluate_attempt(n)
    verdict = result["verdict"]
    speed = f" {result['speedup']:.3g}x" if result.get("speedup") is not None else ""
    sid = rt.state.attempts[n].params.get("strategy")
    if sid:
        linked = ledger_mod.link(rt.state.ledger, sid, rt.state.attempts[n])
        if linked is not None:
            rt.emit("ledger.updated", {"ledger": linked, "change": {"action": "evidence", "id": sid, "attempt": n}})
    data = {"attempt": n, "verdict": verdict, "result": result, "report": _report(result)}
    if warnings:
        data["forced_past"] = [w["strategy"] for w in warnings]
    return ToolOutcome(f"attempt {n}: {verdict}{speed}", data)


# -- ledger, person, end -----------------------------------------------------------------------------
def _ledger(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    fields = {k: v for k, v in args.items() if k not in ("action", "id")}
    try:
        if args["action"] == "add":
            new, entry = ledger_mod.add(rt.state.ledger, fields, rt.state)
        else:
            if not args.get("id"):
                raise ToolError("ledger: update needs the strategy id")
            new, entry = ledger_mod.update(rt.state.ledger, args["id"], fields, rt.state)
    except ledger_mod.LedgerError as exc:
        raise ToolError(f"ledger: {exc}") from None
    rt.emit("ledger.updated", {"ledger": new, "change": {"action": args["action"], "id": entry["id"]}})
    verb = "added" if args["action"] == "add" else "updated"
    return ToolOutcome(f"{entry['id']} {verb} [{entry['status']}]", {"entry": entry})


def _ask_person(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    question = args["question"].strip()
    if not question:
        raise ToolError("ask_person: the question is empty")
    if rt.ask(question):
        return ToolOutcome("question sent; the answer will arrive as a message from the person in a later turn "
                           "(keep working meanwhile)", {"question": question, "sent": True})
    return ToolOutcome("nobody can answer now (no one is watching this run); decide yourself and record why in the "
                       "ledger", {"question": question, "sent": False})


def _finish(rt: "AgentRuntime", args: dict[str, Any]) -> ToolOutcome:
    return ToolOutcome(f"finish recorded: {args['reason']}. (If you read this, the person resumed the run: keep "
                       "improving the kernel.)", {"reason": args["reason"]})


def _prop(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": description, **extra}


_NOTE = _prop("string", "One line: what this version changes and why.")
_STRATEGY = _prop("string", "Ledger id of the strategy this change belongs to (e.g. 'S3').")

TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool(
            "read_task",
            "The goal contract: task, shapes shown to the agent, tolerance, baseline, forbidden imports and ops.",
            {"type": "object", "properties": {}},
            _read_task,
        ),
        Tool(
            "read_kernel",
            "The source of an attempt (default: the latest; the seed before any attempt).",
            {"type": "object", "properties": {"attempt": _prop("integer", "Attempt number.", minimum=1)}},
            _read_kernel,
        ),
        Tool(
            "read_file",
            "Read a file of the task (reference.py, seed.py, baseline.py) or of this session "
            "(e.g. attempts/0003/diff.patch, attempts/0003/result.json). Relative paths only.",
            {"type": "object", "properties": {"path": _prop("string", "Relative path.")}, "required": ["path"]},
            _read_file,
        ),
        Tool(
            "write_kernel",
            "Write a whole kernel file as a new attempt (not evaluated yet). Parent defaults to the latest attempt.",
            {"type": "object", "properties": {
                "source": _prop("string", "The complete Python file."),
                "note": _NOTE, "strategy": _STRATEGY,
                "parent": _prop("integer", "The attempt this one derives from.", minimum=1)},
             "required": ["source"]},
            _write_kernel,
        ),
        Tool(
            "edit_kernel",
            "Exact search/replace on an attempt's source (default: the latest) giving a new attempt. The search "
            "text must occur exactly once, whitespace included.",
            {"type": "object", "properties": {
                "search": _prop("string", "Exact text to replace (occurs once)."),
                "replace": _prop("string", "Replacement text."),
                "note": _NOTE, "strategy": _STRATEGY,
                "attempt": _prop("integer", "The attempt to edit (default: the latest).", minimum=1)},
             "required": ["search", "replace"]},
            _edit_kernel,
        ),
        Tool(
            "evaluate",
            "Evaluate an attempt (default: the latest) in a fresh process: correctness on every shape, then timing "
            "against the baseline. Refuses a change that repeats a failed strategy unless force=true.",
            {
                "type": "object",
                "properties": {
                    "attempt": _prop("integer", "Attempt number (default: the latest).", minimum=1),
                    "force": _prop("boolean", "Evaluate even though the change repeats a failed strategy."),
                    "source": _prop("string", "Write this file as a new attempt and evaluate it in one step."),
                    "note": _NOTE,
                    "strategy": _STRATEGY,
                    "params": _prop("object", "Tunable values this version sets (for the record)."),
                    "parent": _prop("integer", "With source: the attempt it derives from.", minimum=1),
                },
            },
            _evaluate,
        ),
        Tool(
            "profile",
            "Nsight Compute on one shape of an attempt (default: the best): DRAM/L2/SM throughput, occupancy, "
            "registers, shared memory, L2 hit rate and bytes, stall reasons. CUDA sessions only; every evaluation "
            "on CUDA already carries a kernel table and roofline class.",
            {"type": "object", "properties": {
                "attempt": _prop("integer", "Attempt number (default: the best).", minimum=1),
                "shape": _prop("string", "A shape name (default: the first benchmark shape).")}},
            _profile,
        ),
        Tool(
            "list_attempts",
            "The latest attempts, one line each: parent, verdict, speedup, strategy and note.",
            {"type": "object", "properties": {"last": _prop("integer", "How many (default 20).", minimum=1)}},
            _list_attempts,
        ),
        Tool(
            "show_best",
            "The best attempt so far, with its source.",
            {"type": "object", "properties": {}},
            _show_best,
        ),
        Tool(
            "diff_attempts",
            "Unified diff between two attempts.",
            {"type": "object", "properties": {"a": _prop("integer", "From attempt.", minimum=1),
                                              "b": _prop("integer", "To attempt.", minimum=1)},
             "required": ["a", "b"]},
            _diff_attempts,
        ),
        Tool(
            "ledger",
            "Add a strategy to the ledger or update one (status, expected vs actual effect, why, evidence "
            "attempts). Record every idea before trying it; mark failures with why.",
            {"type": "object", "properties": {
                "action": _prop("string", "add or update.", enum=["add", "update"]),
                "id": _prop("string", "Strategy id, for update (e.g. 'S2')."),
                "strategy": _prop("string", "One line: what the strategy changes."),
                "status": _prop("string", "Its status.", enum=list(ledger_mod.STATUSES)),
                "expected": _prop("string", "Expected effect."),
                "actual": _prop("string", "Measured effect."),
                "why": _prop("string", "Why it failed, partly worked or was dropped."),
                "attempts": _prop("array", "Attempt numbers that are its evidence.",
                                  items={"type": "integer", "minimum": 1})},
             "required": ["action"]},
            _ledger,
        ),
        Tool(
            "ask_person",
            "Ask the person watching a question without waiting; the answer arrives later as a message.",
            {"type": "object", "properties": {"question": _prop("string", "The question.")},
             "required": ["question"]},
            _ask_person,
        ),
        Tool(
            "finish",
            "End the session: the kernel is as good as you can make it.",
            {"type": "object", "properties": {"reason": _prop("string", "One line: why you stop.")},
             "required": ["reason"]},
            _finish,
        ),
    )
}

MODEL_TOOLS = tuple(TOOLS)
"""The tools an LLM backend is shown, in this order."""
