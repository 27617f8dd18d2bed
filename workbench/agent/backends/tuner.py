"""The offline tuner: searches the tunables a kernel declares, through the same tools as an LLM agent."""

from __future__ import annotations

import ast
import re
from typing import Any, Iterator

from workbench.agent.backends.base import Finish, StepBackend, ToolCall, Wait
from workbench.agent.backends.registry import BackendOptions, BackendSpec
from workbench.agent.backends.transport import BackendError
from workbench.agent.tunables import (
    Declared,
    TunablesError,
    config_key,
    grid,
    neighbours,
    read_declared,
    with_config,
)
from workbench.journal.events import NudgeReceived
from workbench.session.revisions import sha256_text
from workbench.session.state import Attempt, SessionState
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
    """Coordinate descent around the best config, then the rest of the grid, until the space is exhausted; with
    several evaluation slots it keeps one configuration in flight per slot.

    Results arrive in any order, so each proposal is made from the results in so far:
    1. the untried neighbours of the best result (one tunable changed): coordinate descent around it;
    2. only while results are still pending (the best may yet move): the untried neighbours of the next results in
       speedup order, so the slots stay busy near the best instead of walking the grid;
    3. the rest of the grid (walked only once the best's neighbours are all tried).
    Before any result is in, the seed in flight stands in as the base. "Best" here counts a result still being
    confirmed on the reference slot. When nothing is left to propose the tuner waits for what is in flight, and
    finishes once nothing is: the search converges like the serial one (the final best has every neighbour
    evaluated; the whole grid when the budget allows).

    Nudges of the form NAME=VALUE pin a tunable: a persistent nudge for the rest of the run, a one-shot nudge
    for the next attempt only. Other nudge text is acknowledged as not understood. A config is never tried twice:
    not by its values (an attempt's params) and not by its source (an attempt of any author with that very text).
    """

    name = "tuner"

    # -- decisions -----------------------------------------------------------------------------
    def next_action(self, state: SessionState, task: Task) -> ToolCall | Finish | Wait:
        """Evaluate what is not evaluated yet (the starting kernel, attempt 1; an interrupted attempt), or keep one
        untried config per slot in flight."""
        jobs = list(state.jobs.values())
        running = {job["attempt"] for job in jobs}
        for attempt in sorted(state.attempts.values(), key=lambda a: a.n):
            if attempt.verdict is None and not attempt.eval_error and attempt.n not in running:
                return ToolCall("evaluate", {"attempt": attempt.n, "wait": "none"})
        if not state.attempts:
            return Finish("no kernel to tune: the session has no attempt (the runtime writes the starting kernel "
                          "as attempt 1)")
        candidates = {job["attempt"] for job in jobs if job.get("kind", "candidate") == "candidate"}
        if len(candidates) >= self.workers:
            return Wait(f"{len(candidates)} configurations in flight")
        pending = bool(jobs)
        ranked = sorted((a for a in state.attempts.values() if a.verdict == "ok" and a.speedup is not None),
                        key=lambda a: (-a.speedup, a.n))  # type: ignore[operator]
        if not ranked:
            if candidates:  # nothing judged yet: search around the seed while it is evaluated
                ranked = [state.attempts[min(candidates)]]
            elif pending:
                return Wait("waiting for results")
            else:
                return self._no_base(state)
        top = ranked[0]
        try:
            declared = self._declared(top.source)
        except TunablesError as exc:
            if pending:
                return Wait("waiting for results")
            return Finish(f"the best attempt ({top.n}) declares no usable TUNABLES/CONFIG ({exc}): nothing to search")
        pins = self._pins(state, set(declared.space))
        tried = {config_key(a.params) for a in state.attempts.values()}
        sources = {a.sha256 for a in state.attempts.values()}
        for base, config in self._proposals(top, declared, ranked[1:] if pending else [], pins):
            if config_key(config) in tried:
                continue
            source = with_config(base.source, config)
            if sha256_text(source) in sources:
                continue  # its result is in the journal already (e.g. a person's edit set these values)
            base_config = read_declared(base.source).config
            changed = {k: v for k, v in config.items() if base_config.get(k) != v}
            note = ", ".join(f"{k}={v}" for k, v in changed.items()) or "re-run base"
            return ToolCall("evaluate", {"source": source, "params": config, "note": note, "parent": base.n,
                                         "wait": "none"})
        if pending:
            return Wait("every proposal is tried or in flight")
        pinned = any(declared.space.get(k) != [v] for k, v in pins.items())
        return Finish("search space exhausted" + (" under pinned tunables" if pinned else ""))

    def _proposals(self, top: Attempt, declared: Declared, others: list[Attempt],
                   pins: dict[str, Any]) -> Iterator[tuple[Attempt, dict[str, Any]]]:
        """(base, config) in the order of the class docstring."""
        space = {**declared.space, **{k: [v] for k, v in pins.items()}}
        start = {**declared.config, **pins}
        yield top, start
        for config in neighbours(space, start):
            yield top, config
        for other in others:
            try:
                theirs = self._declared(other.source)
            except TunablesError:
                continue
            around = {**theirs.space, **{k: [v] for k, v in pins.items() if k in theirs.space}}
            for config in neighbours(around, {**theirs.config, **pins}):
                yield other, config
        for config in grid(space):
            yield top, {**declared.config, **config}

    @staticmethod
    def _no_base(state: SessionState) -> Finish:
        """Nothing judged correct and nothing in flight: the search cannot start."""
        first = state.attempts[min(state.attempts)]
        if first.verdict is None:
            raise BackendError(f"attempt {first.n} could not be evaluated: {first.eval_error}")
        return Finish(f"no correct kernel to tune: attempt {first.n} is {first.verdict}: {first.message}")

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
