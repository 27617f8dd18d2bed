"""What every tool is made of: its schema, the narrow context it runs in, its outcome and how that reads back.

A tool is one object (a Tool subclass): its name, description and argument schema (one JSON-schema subset that
any model API takes as it is), how it runs against a ToolContext, the data of its result that is journaled
(ToolOutcome.data, all of it: nothing is stripped later) and how that journaled result reads to the model
(`render`). Its one-line summary is what the TUI's event log and the tuner's memory show.

Tools never see the runtime: the ToolContext gives them the session state and task to read and the few effects
a tool may have (journal an event, write an attempt, evaluate one, ask the person).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from workbench.journal.events import Block, TextBlock

if TYPE_CHECKING:
    from workbench.agent.evaluation import Evaluated
    from workbench.journal import Event
    from workbench.session.state import Attempt, SessionState
    from workbench.tasks import Task


class ToolError(Exception):
    """A bad call: the agent gets this message as the tool's result, the run goes on."""


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool returns: a one-line summary and the data journaled in tool.result.

    `data` must be enough to render the result for a model again after a restart, from the journal alone: bulky
    things the journal holds elsewhere (an attempt's source, an evaluation's full result, the goal) are referred
    to by number, not copied.
    """

    summary: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Deferred:
    """A call whose result waits for evaluations in flight: the runtime journals its tool.result once `ready()`
    holds, with `finish()`'s outcome, and meanwhile runs other work (other branches, other tool calls). A crash
    before then leaves the call open, and a resume closes it as aborted like any interrupted call."""

    ready: Callable[[], bool]
    finish: Callable[[], ToolOutcome]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as a model API is shown it; each transport maps it onto its own request format."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments (an object)."""


@dataclass(frozen=True)
class ToolContext:
    """The narrow context the runtime gives a tool: what it may read and the effects it may have."""

    state: "SessionState"
    """The live session state (read only: every change goes through `emit`)."""
    task: "Task"
    device: str
    """The device evaluations run on ("cpu" or "cuda")."""
    seed_source: str
    """The kernel the session started from (read_kernel shows it before any attempt exists)."""
    session_dir: Path
    """The session folder, for read_file."""
    emit: Callable[[str, dict[str, Any]], "Event"]
    """Journal an event (ledger.updated, profile.finished) and fold it into the state."""
    write_attempt: Callable[..., int]
    """write_attempt(source, *, note, params, parent) -> the new attempt's number."""
    evaluate: Callable[..., "Evaluated | None"]
    """evaluate(n, *, force) -> the attempt's result from the journal (that source was evaluated before), or None
    once it is queued (or already running) on the run's evaluation slots."""
    final: Callable[[int], bool]
    """Whether attempt n's result stands (judged, confirmed if it was a new best, nothing of it still running)."""
    attempt_path: Callable[[int], Path]
    """The kernel file of attempt n."""
    ask: Callable[[str], bool]
    """Put a question to the person without waiting; whether anyone can answer it."""

    def attempt(self, n: int, tool: str) -> "Attempt":
        """Attempt n, or a ToolError that names the attempts there are."""
        attempt = self.state.attempts.get(n)
        if attempt is None:
            last = self.state.next_attempt - 1
            raise ToolError(f"{tool}: no attempt {n} (" + (f"attempts 1-{last})" if last else "no attempts yet)"))
        return attempt


def text(value: str) -> TextBlock:
    """A text block of a tool result."""
    return {"type": "text", "text": value}


class Tool:
    """One tool. Subclasses set the class attributes and implement `run`; most also say how their result reads."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]
    """The argument schema, built with `arguments()`."""
    added: ClassVar[dict[str, int]] = {}
    """Arguments added after the first prompts version, with the version that added each: a request journaled
    under an older version is rebuilt (show --prompt-at) with the schema the model was shown then."""

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        """Do the call (arguments already checked against the schema)."""
        raise NotImplementedError

    def render(self, data: Mapping[str, Any], summary: str, state: "SessionState") -> list[Block]:
        """A successful result as the model reads it, from its journaled data and the state as of the request."""
        return [text(summary or "ok")]

    def spec(self, version: int | None = None) -> ToolSpec:
        """The tool as a model API is shown it (as of prompts `version`; None: the current one)."""
        if version is None or not self.added:
            return ToolSpec(self.name, self.description, self.parameters)
        props = {k: v for k, v in self.parameters["properties"].items() if self.added.get(k, 1) <= version}
        return ToolSpec(self.name, self.description, {**self.parameters, "properties": props})


# -- schemas ----------------------------------------------------------------------------------------------------
def prop(kind: str, description: str, **extra: Any) -> dict[str, Any]:
    """One argument: a JSON type ('string', 'integer', 'number', 'boolean', 'object', 'array') and what it is.

    Extra keys are the few every model API accepts: enum, minimum, items.
    """
    unknown = set(extra) - {"enum", "minimum", "items"}
    if unknown:
        raise ValueError(f"schema keys {sorted(unknown)} are not in the subset every model API takes")
    return {"type": kind, "description": description, **extra}


def arguments(required: tuple[str, ...] = (), **properties: dict[str, Any]) -> dict[str, Any]:
    """A tool's argument schema: an object of the given properties."""
    # "required" goes before "properties", as the request bodies journaled before this module existed had it:
    # the same bytes keep a resumed session's prompt cache.
    schema: dict[str, Any] = {"type": "object"}
    if required:
        schema["required"] = list(required)
    schema["properties"] = properties
    return schema


_TYPES = {"string": str, "integer": int, "object": dict, "number": (int, float), "boolean": bool, "array": list}


def _check_value(where: str, spec: Mapping[str, Any], value: Any) -> None:
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
    props = tool.parameters.get("properties", {})
    for name in tool.parameters.get("required", []):
        if name not in args:
            raise ToolError(f"{tool.name}: missing argument {name!r}")
    for name, value in args.items():
        if name not in props:
            raise ToolError(f"{tool.name}: unknown argument {name!r} (takes {', '.join(props) or 'no arguments'})")
        _check_value(f"{tool.name}: {name}", props[name], value)
    return args
