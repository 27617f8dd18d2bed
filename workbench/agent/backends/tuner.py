"""The offline tuner: searches the tunables a kernel declares, through the same tools as an LLM agent."""

from __future__ import annotations

import ast
import re
from typing import Any

from workbench.agent.backends.base import Finish, StepBackend, ToolCall
from workbench.agent.backends.registry import BackendOptions, BackendSpec
from workbench.agent.backends.transport import BackendError
from workbench.agent.tunables import TunablesError, config_key, grid, neighbours, read_declared, with_config
from workbench.journal.events import NudgeReceived
from workbench.session.revisions import sha256_text
from workbench.session.state import SessionState
from workbench.tasks import Task

_PIN = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([^\s,;]+)")


def parse_pins(text: str, names: set[str]) -> dict[str, Any]:
    """Read `NAME=VALUE` pairs for declared tunables from a nudge ('try num_warps=8, BLOCK_ROWS=4')."""
    pins: dict[str, Any] = {}
    for name, raw in _PIN.findall(text):
        if name not in names:
            continue
        try:
            pins[name] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            pins[name] = raw
    return pins


class TunerBackend(StepBackend):
    """Coordinate descent around the best config, then the rest of the grid, until the space is exhausted.

    Nudges of the form NAME=VALUE pin a tunable: a persistent nudge for the rest of the run, a one-shot nudge
    for the next attempt only. Other nudge text is acknowledged as not understood. A config is never tried twice:
    not by its values (an attempt's params) and not by its source (an attempt of any author with that very text).
    """

    name = "tuner"

    # -- decisions -----------------------------------------------------------------------------
    def next_action(self, state: SessionState, task: Task) -> ToolCall | Finish:
        """Evaluate what is not evaluated yet (the starting kernel, attempt 1; an interrupted attempt), or try the
        next untried config."""
        for attempt in sorted(state.attempts.values(), key=lambda a: a.n):
            if attempt.verdict is None:
                return ToolCall("evaluate", {"attempt": attempt.n})
        if not state.attempts:
            return Finish("no kernel to tune: the session has no attempt (the runtime writes the starting kernel "
                          "as attempt 1)")
        base = state.best_attempt
        if base is None:
            first = state.attempts[min(state.attempts)]
            return Finish(f"no correct kernel to tune: attempt {first.n} is {first.verdict}: {first.message}")
        try:
            declared = self._declared(base.source)
        except TunablesError as exc:
            return Finish(f"the best attempt ({base.n}) declares no usable TUNABLES/CONFIG ({exc}): nothing to search")
        space = dict(declared.space)
        for name, value in self._pins(state, set(space)).items():
            space[name] = [value]
        tried = {config_key(a.params) for a in state.attempts.values()}
        sources = {a.sha256 for a in state.attempts.values()}
        pinned = {k: values[0] for k, values in space.items() if values is not declared.space.get(k)}
        start = {**declared.config, **pinned}
        ordered = [start, *neighbours(space, start), *({**declared.config, **g} for g in grid(space))]
        for config in ordered:
            if config_key(config) in tried:
                continue
            source = with_config(base.source, config)
            if sha256_text(source) in sources:
                continue  # its result is in the journal already (e.g. a person's edit set these values)
            changed = {k: v for k, v in config.items() if declared.config.get(k) != v}
            note = ", ".join(f"{k}={v}" for k, v in changed.items()) or "re-run base"
            return ToolCall("evaluate", {"source": source, "params": config, "note": note, "parent": base.n})
        return Finish("search space exhausted" + (" under pinned tunables" if space != declared.space else ""))

    def acknowledge(self, nudge: NudgeReceived, state: SessionState, task: Task) -> str:
        """Say which tunables the nudge pins, or that the tuner cannot act on free text."""
        source = state.best_attempt.source if state.best_attempt else self.seed_source
        try:
            names = set(self._declared(source).space)
        except TunablesError:
            names = set()
        pins = parse_pins(nudge["text"], names)
        if not pins:
            return "tuner: no NAME=VALUE for a declared tunable (" + ", ".join(sorted(names)) + "); noted only"
        scope = "for the rest of the run" if nudge.get("persistent") else "for the next attempt"
        return "tuner: pinning " + ", ".join(f"{k}={v!r}" for k, v in pins.items()) + " " + scope

    # -- helpers -------------------------------------------------------------------------------
    @staticmethod
    def _declared(source: str):
        return read_declared(source)

    @staticmethod
    def _pins(state: SessionState, names: set[str]) -> dict[str, Any]:
        """Persistent pins that are active, plus one-shot pins received since the latest attempt was written."""
        latest = state.current.written_seq if state.current else 0
        pins: dict[str, Any] = {}
        for nudge in state.nudges:
            if nudge["persistent"] and nudge["active"]:
                pins.update(parse_pins(nudge["text"], names))
            elif not nudge["persistent"] and nudge["seq"] > latest:
                pins.update(parse_pins(nudge["text"], names))
        return pins


def preflight(options: BackendOptions) -> None:
    """A new session needs a seed that declares what to search.

    Raises:
        BackendError: the seed declares no usable TUNABLES/CONFIG.
    """
    if not options.fresh:
        return
    try:
        read_declared(options.seed_source)
    except TunablesError as exc:
        raise BackendError(f"the tuner searches the TUNABLES/CONFIG a kernel declares, and {options.seed_origin} "
                           f"declares none ({exc}): write a seed with TUNABLES and CONFIG (or pass --start FILE), or "
                           "run --agent claude") from None


SPEC = BackendSpec("tuner", "the offline tuner: searches the TUNABLES a kernel declares (no model, no key)",
                   lambda options: TunerBackend(options.seed_source), preflight=preflight)
"""The registry entry (pyproject.toml: workbench.backends, tuner)."""
