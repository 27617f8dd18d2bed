"""How the owner reads one evaluation's messages (service._Watch), on a scripted pipe.

The service prepares between evaluations (baseline warm-ups, oracle outputs) and announces each step with no
reader; those announcements wait in the pipe, stamped with when they began. The next evaluation reads them first.
A real service reproduces it in five minutes (evaluate, wait past the oracle's 300 s budget, evaluate: before the
fix a "hung" fault and a restart); here the same message stream is scripted.
"""

from __future__ import annotations

import time
from collections import deque
from types import SimpleNamespace
from typing import Any

from workbench.evaluator import limits
from workbench.evaluator.assemble import Outcome
from workbench.evaluator.service import Fault, _Watch

EVAL = 7


class ScriptedPipe:
    """The service's pipe as batches of messages: a read that may not wait gets what the current batch still
    holds; a read that may wait moves on to the next batch (what the service says later)."""

    def __init__(self, *batches: list[dict[str, Any]]):
        self.batches = deque(deque(b) for b in batches)
        self.env: dict[str, Any] = {}

    def read(self, deadline: float | None) -> dict[str, Any] | None:
        may_wait = deadline is None or deadline > time.monotonic()
        while self.batches and not self.batches[0] and may_wait:
            self.batches.popleft()
        if self.batches and self.batches[0]:
            return self.batches[0].popleft()
        return None

    def log_tail(self) -> str:
        return ""


class Owner:
    device = "cpu"

    def __init__(self) -> None:
        self.faults: list[Fault] = []
        self.restarts = 0

    def _restart(self) -> None:
        self.restarts += 1

    def _replenish(self, warm: bool) -> None:
        pass


def stage(name: str, *, ago: float = 0.0, eval_id: int | None = None, trusted: bool = True,
          budget: float | None = None, **where: Any) -> dict[str, Any]:
    return {"type": "stage", "stage": name, "trusted": trusted, "eval": eval_id, "t": time.monotonic() - ago,
            "budget_s": budget, **where}


def result() -> dict[str, Any]:
    return {"type": "result", "eval": EVAL, "healthy": True}


def watch(pipe: ScriptedPipe, shown: list[str] | None = None) -> tuple[Outcome | Fault, Owner]:
    owner = Owner()
    sub = SimpleNamespace(path="cand.py")
    on_stage = None if shown is None else (lambda s: shown.append(f"{s['stage']} {s.get('shape', '')}".strip()))
    return _Watch(owner, pipe, SimpleNamespace(proc=None), sub, EVAL, None, on_stage).run(), owner  # type: ignore


def test_an_old_idle_announcement_is_not_a_hung_service():
    oracle_s = limits.TRUSTED_S["oracle"]
    pipe = ScriptedPipe([stage("oracle", ago=oracle_s + 60, budget=oracle_s, shape="C1"), stage("idle", ago=oracle_s)],
                        [stage("startup", eval_id=EVAL, trusted=False, budget=60.0)], [result()])
    outcome, owner = watch(pipe)
    assert isinstance(outcome, Outcome) and outcome.kind == "result", outcome
    assert owner.faults == [] and owner.restarts == 0


def test_a_trusted_step_past_its_budget_with_nothing_after_it_is_hung():
    oracle_s = limits.TRUSTED_S["oracle"]
    pipe = ScriptedPipe([stage("idle", ago=oracle_s + 90), stage("oracle", ago=oracle_s + 60, budget=oracle_s,
                                                                   shape="C1")], [result()])
    outcome, _ = watch(pipe)
    assert isinstance(outcome, Fault) and outcome.kind == "hung", outcome
    assert f"{oracle_s:g} s limit" in outcome.message


def test_the_preparation_an_evaluation_waits_behind_is_shown_once_it_is_current():
    shown: list[str] = []
    pipe = ScriptedPipe([stage("oracle", ago=500, budget=300, shape="C3"), stage("idle", ago=400),
                         stage("precompile", ago=0.5, budget=900)],
                        [stage("baseline", budget=900, shape="K1")],
                        [stage("startup", eval_id=EVAL, trusted=False, budget=60.0),
                         stage("oracle", eval_id=EVAL, budget=300, shape="K1")],
                        [result()])
    outcome, _ = watch(pipe, shown)
    assert isinstance(outcome, Outcome)
    assert shown == ["precompile", "baseline K1", "startup", "oracle K1"]


def test_an_idle_service_shows_nothing_before_the_evaluation_starts():
    shown: list[str] = []
    pipe = ScriptedPipe([stage("oracle", ago=20, budget=300, shape="C3"), stage("idle", ago=10)],
                        [stage("startup", eval_id=EVAL, trusted=False, budget=60.0)], [result()])
    watch(pipe, shown)
    assert shown == ["startup"]
