"""Evaluating attempts for the runtime on the run's evaluation pool: jobs out, results journaled as they come, the
journal cache, the held-out gate of a new best (confirmed on the reference slot, whose runner also lists its kernels
from outside the candidate process: workbench.fleet.observe) and the profile events.

The pool (workbench.fleet.api) runs evaluations on its slots, any number at once; `Evaluations` is the only place
its reports become journal events, always on the runtime's thread: `eval.queued` before the pool sees a job,
`eval.started` when a slot takes it, `eval.requeued` when the slot's trusted side failed on it and it waits for
another slot, `eval.finished` (naming the slot) or `eval.failed` when it ends, `fleet.slot` when a slot faults or
retires. A candidate result that would be a new best is journaled `pending` and stands only
once the held-out check on the reference slot confirms it (priority "heldout": it runs next on that slot).

Resume rule: a job journaled as queued or started with no end (a `kill -9`, or a stop with evaluations in flight)
is re-queued when its attempt still has no result of that kind (a candidate never judged, a best not yet
confirmed): nothing was acted on, so running it is the only way the attempt gets its result and the journal holds
no result to run twice. A job whose attempt did get a result meanwhile (a forced re-evaluation of a judged
attempt) is closed as aborted with eval.failed. Attempt numbers come from attempt.written only, so they are never
reused.

The Evaluator protocol (below) stays what one slot runs: the CLI's slots run an EvaluationService each, a test a
FunctionEvaluator (`AgentRuntime(evaluator=...)` puts one behind a one-slot pool, workbench.agent.slots).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from workbench.evaluator.result import EvalResult, public_part
from workbench.fleet.api import (
    EvalJob,
    EvaluationPool,
    JobFailed,
    JobFinished,
    JobKind,
    JobRequeued,
    JobStarted,
    PoolEvent,
    SlotChanged,
    SlotInfo,
)
from workbench.fleet.observe import heldout_passed
from workbench.journal.events import (
    EvalFailed,
    EvalFinished,
    EvalQueued,
    EvalRequeued,
    EvalStarted,
    FleetSlot,
    HeldoutSummary,
)
from workbench.plain import map_leaves
from workbench.session.atomic import write_json_atomic

if TYPE_CHECKING:
    from workbench.journal import Event
    from workbench.session.state import Attempt, SessionState
    from workbench.session.store import SessionFiles
    from workbench.tasks import Task

HELDOUT_DIR = "heldout"
"""Session subfolder with held-out results: the person may read it, the agent's tools may not."""

class Evaluator(Protocol):
    """Evaluates one candidate file of a task on the device it was made for."""

    def evaluate(self, task: "Task", path: Path, *, heldout: bool = False) -> EvalResult:
        """The candidate's result (ARCHITECTURE.md, evaluator contract); with heldout, the held-out shapes too."""
        ...

    def close(self) -> None:
        """Release what the evaluator keeps between evaluations (prestarted processes, a service)."""
        ...


class FunctionEvaluator:
    """An Evaluator from a plain function `fn(task, path, device=..., heldout=...)` (tests, scripts)."""

    def __init__(self, fn: Callable[..., EvalResult], device: str = "cpu") -> None:
        self.fn = fn
        self.device = device

    def evaluate(self, task: "Task", path: Path, *, heldout: bool = False) -> EvalResult:
        """Call the function."""
        return self.fn(task, path, device=self.device, heldout=heldout)

    def close(self) -> None:
        """Nothing to release."""


def ncu_observer(task: "Task", path: Path, gpu: str | None) -> dict[str, Any]:
    """ncu's kernel list for one call of the task's first CUDA shape on `gpu` (workbench.profiler.observer); a slot's
    KernelObserver (workbench.fleet.observe)."""
    from workbench.profiler import observer

    return observer.check(task.name, path, task.shapes["cuda"][0].name, gpu=gpu)


def json_safe(value: Any) -> Any:
    """Replace NaN/inf (not JSON) by their names, so a NaN error figure can be journaled and still read."""
    return map_leaves(value, lambda v: str(v) if isinstance(v, float) and not math.isfinite(v) else v)


def journaled_result(attempt: "Attempt") -> EvalResult:
    """What the journal holds of an attempt's latest evaluation (the fold keeps these fields of eval.finished)."""
    return {"verdict": attempt.verdict, "message": attempt.message, "speedup": attempt.speedup,  # type: ignore[typeddict-item]
            "timing_comparable": attempt.timing_comparable, "shapes": list(attempt.shapes)}


@dataclass(frozen=True)
class Evaluated:
    """An attempt's evaluation as the agent acts on it."""

    result: EvalResult
    """The result the attempt stands on (after the held-out gate, for a new best)."""
    cached_seq: int | None = None
    """Set when nothing ran: the seq of the eval.finished an identical source was given before."""


class EvaluationsError(Exception):
    """No evaluation can run any more (every slot retired or skipped): the run stops, resumable; one line."""


class Evaluations:
    """Evaluates attempts on the run's pool and journals what came of it (see the module docstring).

    Args:
        pool: the run's evaluation slots; closed by close().
        reference: the slot that confirms a new best (None: the pool's first slot).
    """

    def __init__(self, pool: EvaluationPool, *, task: "Task", state: "SessionState", files: "SessionFiles",
                 emit: Callable[[str, dict[str, Any]], "Event"], attempt_path: Callable[[int], Path],
                 reference: str | None = None) -> None:
        self.pool = pool
        """Runs the evaluations; closed by close()."""
        self.task = task
        self.state = state
        """The live session state (read)."""
        self.files = files
        """The session folder: attempts/NNNN/result.json, heldout/NNNN.json."""
        self._emit = emit
        self._attempt_path = attempt_path
        self.reference = reference or pool.slots()[0].info.slot
        """The slot that confirms new bests; moves when it retires."""
        self._stale: dict[str, str] = {}
        """Queued checks cancelled because a faster attempt's check goes first, with the reason journaled."""

    # -- submitting --------------------------------------------------------------------------------------------
    def slots(self) -> list[SlotInfo]:
        """Every slot of the pool, in its order."""
        return [status.info for status in self.pool.slots()]

    def candidate_slots(self) -> int:
        """Slots that can take a candidate now (not retired or skipped): how many are worth keeping in flight."""
        return max(1, sum(1 for s in self.pool.slots() if s.state not in ("retired", "skipped")))

    def open_jobs(self, n: int) -> list[dict[str, Any]]:
        """Jobs of attempt n queued or running (from the journal)."""
        return [job for job in self.state.jobs.values() if job["attempt"] == n]

    def submit(self, n: int, *, kind: JobKind = "candidate", branch: int | None = None, call: str = "",
               requeue_of: str = "") -> str:
        """Journal eval.queued, then hand the job to the pool; returns the job id.

        A held-out check is pinned to the reference slot.
        """
        job_id = f"j{self.state.jobs_queued + 1:05d}"
        heldout = kind == "heldout"
        data = EvalQueued(job=job_id, attempt=n, kind=kind, heldout=heldout)
        if heldout:
            data["slot"] = self.reference
        if branch is not None:
            data["branch"] = branch
        if call:
            data["call"] = call
        if requeue_of:
            data["requeue_of"] = requeue_of
        self._emit("eval.queued", dict(data))
        self.pool.submit(EvalJob(job_id, n, self._attempt_path(n), self.state.attempts[n].source, heldout=heldout,
                                 kind=kind, slot=data.get("slot"), observe=kind == "heldout"))
        return job_id

    def request(self, n: int, *, force: bool = False, branch: int | None = None, call: str = "") -> "Evaluated | None":
        """Attempt n's result from the journal when its source was evaluated before (unless force), else None
        once it is queued; an attempt already queued or running is not queued again (it will not run twice)."""
        if not force:
            done = self._evaluated_twin(self.state.attempts[n])
            if done is not None and not self.open_jobs(done.n):
                return Evaluated(journaled_result(done), cached_seq=done.eval_seq)
        if not self.open_jobs(n):
            self.submit(n, branch=branch, call=call)
        return None

    def final(self, n: int) -> bool:
        """Whether attempt n's result stands: judged (and confirmed if it was a new best), nothing left running."""
        attempt = self.state.attempts[n]
        return (attempt.verdict is not None and not attempt.confirming or bool(attempt.eval_error)) and \
            not self.open_jobs(n)

    def evaluate(self, n: int, *, force: bool = False) -> "Evaluated":
        """Evaluate attempt n and wait for its standing result, journaling whatever else the pool reports meanwhile
        (for scripts and tests; the runtime's tools never block on a result)."""
        cached = self.request(n, force=force)
        if cached is not None:
            return cached
        while not self.final(n):
            self.drain(0.2)
        return Evaluated(journaled_result(self.state.attempts[n]))

    def _evaluated_twin(self, attempt: "Attempt") -> "Attempt | None":
        """The attempt itself when it was evaluated, else an evaluated attempt with the same source."""
        if attempt.verdict is not None:
            return attempt
        return next((a for a in self.state.attempts.values() if a.sha256 == attempt.sha256
                     and a.verdict is not None), None)

    # -- what the pool reports ---------------------------------------------------------------------------------
    def drain(self, timeout: float = 0.0) -> list[int]:
        """Journal everything the pool reported, waiting up to `timeout` s for the first report.

        Returns:
            The attempts whose result came to stand by it (in order).
        """
        finals: list[int] = []
        for event in self.pool.events(timeout):
            n = self._report(event)
            if n is not None and self.final(n) and n not in finals:
                finals.append(n)
        return finals

    def _report(self, event: PoolEvent) -> int | None:
        """Journal one pool event; the attempt it ended a job of, if any."""
        if not isinstance(event, SlotChanged) and event.job.id not in self.state.jobs:
            return None  # not a job this session queued (nothing else may write to its journal)
        if isinstance(event, JobStarted):
            self._emit("eval.started", dict(EvalStarted(job=event.job.id, attempt=event.job.attempt,
                                                        slot=event.slot.to_dict())))  # type: ignore[typeddict-item]
            return None
        if isinstance(event, JobRequeued):
            self._emit("eval.requeued", dict(EvalRequeued(job=event.job.id, attempt=event.job.attempt,
                                                          slot=event.slot.to_dict(),  # type: ignore[typeddict-item]
                                                          message=event.message)))
            return None
        if isinstance(event, JobFinished):
            if event.job.kind == "heldout":
                self._confirm(event.job, event.slot, event.result)
            else:
                self._judged(event.job, event.slot, event.result)
            return event.job.attempt
        if isinstance(event, JobFailed):
            if event.slot is None and event.job.slot not in (None, self.reference) and not event.cancelled:
                # A confirmation pinned to a reference slot that retired before taking it (the pool drops it):
                # queued again on the new reference slot.
                self.submit(event.job.attempt, kind=event.job.kind, requeue_of=event.job.id, **self._asker(event.job))
                return None
            message = self._stale.pop(event.job.id, event.message) if event.cancelled else event.message
            data = EvalFailed(job=event.job.id, attempt=event.job.attempt, message=message,
                              cancelled=event.cancelled, **self._asker(event.job))  # type: ignore[typeddict-item]
            if event.slot is not None:
                data["slot"] = event.slot.to_dict()  # type: ignore[typeddict-item]
            self._emit("eval.failed", dict(data))
            return event.job.attempt
        if isinstance(event, SlotChanged):
            self._slot_changed(event)
        return None

    def _asker(self, job: EvalJob) -> dict[str, Any]:
        """The branch and call that queued a job (journaled with its end, so the result reaches that conversation)."""
        queued = self.state.jobs.get(job.id, {})
        return {k: queued[k] for k in ("branch", "call") if k in queued}

    def _judged(self, job: EvalJob, slot: SlotInfo, raw: EvalResult) -> None:
        """A candidate's result: journaled, pending when it would be a new best (its confirmation is queued)."""
        n = job.attempt
        best_before = self.state.best
        asker = self._asker(job)
        result: EvalResult = json_safe(raw)
        self.files.write_attempt_result(n, result)  # type: ignore[arg-type]
        data = EvalFinished(attempt=n, result=result, job=job.id, slot=slot.to_dict(), **asker)  # type: ignore[typeddict-item]
        pending = self._beats_best(result)
        if pending:
            data["pending"] = True
        self._emit("eval.finished", dict(data))
        if isinstance(result.get("profile"), dict):
            self._profile(n, result["profile"], best_before)
        if pending:
            self._supersede(n)
            self.submit(n, kind="heldout", **asker)

    def _supersede(self, n: int) -> None:
        """Cancel the queued held-out checks of slower pending attempts: the reference slot checks the new best
        first; should it fail, _check_next checks the next one."""
        speedup = self.state.attempts[n].speedup or 0.0
        for job in list(self.state.jobs.values()):
            if job.get("kind") == "heldout" and not job.get("slot_taken") and job["attempt"] != n and \
                    (self.state.attempts[job["attempt"]].speedup or 0.0) < speedup and self.pool.cancel(job["job"]):
                self._stale[job["job"]] = f"superseded: attempt {n} ({speedup:.3g}x) is checked first"

    def _bar(self) -> float | None:
        """The speedup a result must beat to be checked: the confirmed best's, or a better one's being confirmed."""
        return max((a.speedup for a in self.state.attempts.values() if a.speedup is not None and
                    (a.n == self.state.best or a.confirming)), default=None)

    def _beats_best(self, result: EvalResult) -> bool:
        if result.get("verdict") != "ok" or result.get("speedup") is None:
            return False
        bar = self._bar()
        return bar is None or result["speedup"] > bar  # type: ignore[operator]

    def _check_next(self) -> None:
        """After a check failed: the best judged attempt that beats the bar and was never checked gets its check
        (it was not a new best when judged, because the one that just failed was ahead of it; a judged attempt that
        is still unconfirmed was never checked, since a check either confirms it or changes its verdict)."""
        bar = self._bar()
        checked = {j["attempt"] for j in self.state.jobs.values() if j.get("kind") == "heldout"}
        waiting = [a for a in self.state.attempts.values() if a.verdict == "ok" and a.speedup is not None and
                   a.confirmed is False and not a.confirming and a.n not in checked and (bar is None or a.speedup > bar)]
        if waiting:
            top = max(waiting, key=lambda a: (a.speedup, -a.n))
            self.submit(top.n, kind="heldout")

    def _confirm(self, job: EvalJob, slot: SlotInfo, raw: EvalResult) -> None:
        """The held-out check of a new best on the reference slot: it stands, or is demoted; the agent never sees
        the held-out shapes' details.

        The journal gets the attempt's public result, with the verdict turned into a failure when the held-out run
        fails, and a summary (shape count, passed, held-out speedup). Measured on the slot the candidate ran on, the
        attempt keeps the timings of its own evaluation (the gate is pass/fail, not a second noisy sample); measured
        on another slot, it takes the reference slot's, so every best is timed on the one reference GPU. The full
        result goes to heldout/NNNN.json (outside what the agent's tools may read).
        """
        n, path = job.attempt, job.path
        check: EvalResult = json_safe(raw)
        hidden = check.get("heldout") or []
        folder = self.files.dir / HELDOUT_DIR
        folder.mkdir(exist_ok=True)
        write_json_atomic(folder / f"{n:04d}.json", check)
        attempt = self.state.attempts[n]
        measured_here = attempt.slot == slot.slot
        public = public_part(self._candidate_result(n) if measured_here else check)
        public_ok = all(s.get("correct") is not False for s in check.get("shapes", []))
        passed = heldout_passed(check)
        if not passed:
            public["verdict"] = check.get("verdict") if check.get("verdict") != "ok" else "incorrect"  # type: ignore[typeddict-item]
            public["message"] = (f"failed on held-out shapes (details hidden from the agent, in "
                                 f"{HELDOUT_DIR}/{n:04d}.json)") if public_ok else check.get("message", "")
        observed = check.get("observed") if passed else None  # the slot's look from outside (fleet.observe)
        if observed is not None and observed.get("problems"):
            passed = False
            public["verdict"] = "forbidden"
            public["message"] = (f"{path.name}: {observed['problems'][0]} "
                                 "(seen by ncu, outside the candidate process)")
        summary = HeldoutSummary(shapes=len(hidden), passed=passed, speedup=check.get("heldout_speedup"))
        data = EvalFinished(attempt=n, check="heldout", result=public, heldout=summary, job=job.id,
                            slot=slot.to_dict(), **self._asker(job))  # type: ignore[typeddict-item]
        if observed is not None:
            data["observed"] = observed
        self._emit("eval.finished", dict(data))
        if not passed:
            self._check_next()

    def _candidate_result(self, n: int) -> EvalResult:
        """The candidate's own result (attempts/NNNN/result.json), or what the journal holds of it."""
        try:
            return json.loads((self.files.attempt_dir(n) / "result.json").read_text())
        except (OSError, ValueError):
            return journaled_result(self.state.attempts[n])

    def _profile(self, n: int, profile: dict[str, Any], best: int | None) -> None:
        """Journal an evaluation's kernel table and roofline, with deltas against the best attempt's profile."""
        data: dict[str, Any] = {"attempt": n, "source": "evaluation", **profile}
        if best is not None and best != n:
            try:
                previous = json.loads((self.files.attempt_dir(best) / "result.json").read_text()).get("profile")
            except (OSError, ValueError):
                previous = None
            if isinstance(previous, dict):
                from workbench.profiler import diff

                data["against"] = best
                data["deltas"] = diff(previous, profile)
        self._emit("profile.finished", data)

    def _slot_changed(self, event: SlotChanged) -> None:
        """Journal a slot's fault or retirement; a reference slot that leaves hands its role to the next slot."""
        data = FleetSlot(slot=event.slot.to_dict(), state=event.state, message=event.message)  # type: ignore[typeddict-item]
        moved = None
        if event.slot.slot == self.reference and event.state in ("retired", "skipped"):
            moved = next((s.info.slot for s in self.pool.slots() if s.state not in ("retired", "skipped")), None)
            if moved is not None:
                data["reference"] = moved
        self._emit("fleet.slot", dict(data))
        if all(s.state in ("retired", "skipped") for s in self.pool.slots()):
            raise EvaluationsError("every evaluation slot is out of service: " + "; ".join(
                f"{s.info.slot}: {s.faults[-1] if s.faults else s.state}" for s in self.pool.slots()))
        if moved is not None:
            self.reference = moved  # the old slot's queued confirmations come back as JobFailed: queued again here

    # -- resume and stop ---------------------------------------------------------------------------------------
    def recover(self) -> None:
        """Re-queue the evaluations a crash or stop interrupted, or close them as aborted (module docstring)."""
        for job in sorted(self.state.jobs.values(), key=lambda j: j["seq"]):
            attempt = self.state.attempts.get(job["attempt"])
            kind = job.get("kind", "candidate")
            needed = attempt is not None and (attempt.confirming if kind == "heldout" else attempt.verdict is None)
            asker = {k: job[k] for k in ("branch", "call") if k in job}
            if needed:
                self.submit(job["attempt"], kind=kind, requeue_of=job["job"], **asker)
            else:
                self._emit("eval.failed", dict(EvalFailed(
                    job=job["job"], attempt=job["attempt"], cancelled=True, **asker,  # type: ignore[typeddict-item]
                    message="interrupted (the run ended before it finished); the attempt has a result already")))
        for attempt in self.state.attempts.values():
            if attempt.confirming and not any(j.get("kind") == "heldout" for j in self.open_jobs(attempt.n)):
                self.submit(attempt.n, kind="heldout")  # the run ended between a new best and its check

    def close(self) -> None:
        """Drop what is still queued and close the pool (results still running are not journaled: a resume
        re-queues them)."""
        self.pool.cancel_all()
        self.pool.close()
