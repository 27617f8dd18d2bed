"""Evaluating attempts for the runtime: the evaluator it is given, the journal cache, the held-out gate of a new best,
the outside-process kernel observer and the profile events.

The evaluation itself is an injected `Evaluator` (protocol below): the CLI passes a ServiceEvaluator (the run's
evaluation service of issue #16: one trusted process, a fresh candidate process per evaluation), a test a
FunctionEvaluator. `Evaluations` owns its lifetime: `close()` at the end of
a run closes it.

An evaluation can be aborted (`Evaluations.abort`, from any thread: the run is stopping): the evaluator's `cancel()`
kills the candidate at once and the evaluation raises EvalCancelled, which the runtime journals as an aborted tool
call. A new best whose held-out check was cut short (aborted, or the process killed) is checked again when the
session resumes (`Evaluations.confirm_best`), so no best stands unchecked.

Evaluations are synchronous today. The seam for several in flight (issue #17) is `Evaluations.evaluate`: a
scheduler would journal `eval.started` {attempt, slot, gpu, host} before handing the attempt to a slot and
`eval.finished` when its result comes back; `_gate` and `_profile` already work from an attempt number and a
result, in whatever order results arrive.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from workbench.evaluator.errors import EvalCancelled
from workbench.evaluator.result import EvalResult, public_part
from workbench.journal.events import EvalFinished, HeldoutSummary
from workbench.session.atomic import write_json_atomic

if TYPE_CHECKING:
    from workbench.journal import Event
    from workbench.session.state import Attempt, SessionState
    from workbench.session.store import SessionFiles
    from workbench.tasks import Task

HELDOUT_DIR = "heldout"
"""Session subfolder with held-out results: the person may read it, the agent's tools may not."""

KernelObserver = Callable[["Task", Path], dict[str, Any]]
"""Lists a candidate's kernels from outside its process: {'problems': [...]} or {'error': ...}."""


class Evaluator(Protocol):
    """Evaluates one candidate file of a task on the device it was made for."""

    def evaluate(self, task: "Task", path: Path, *, heldout: bool = False) -> EvalResult:
        """The candidate's result (ARCHITECTURE.md, evaluator contract); with heldout, the held-out shapes too."""
        ...

    def cancel(self) -> None:
        """Abort the evaluation in progress, if any (thread-safe, returns at once): evaluate() raises EvalCancelled."""
        ...

    def close(self) -> None:
        """Release what the evaluator keeps between evaluations (prestarted processes, a service)."""
        ...


class ServiceEvaluator:
    """The run's evaluation service (workbench.evaluator.EvaluationService, issue #16): one trusted process for the
    run (reference, baseline, oracle outputs), a fresh candidate process per evaluation, the next one started while
    the agent thinks."""

    def __init__(self, device: str, task: "Task | None" = None) -> None:
        self.device = device
        """"cpu", "cuda" or "auto", as the session evaluates."""
        self._services: dict[str, Any] = {}
        if task is not None:
            self._service(task, start_only=True)  # starts now, while the backend prepares its first step

    def _service(self, task: "Task", *, start_only: bool = False) -> Any:
        from workbench.evaluator import EvalUsageError, EvaluationService

        service = self._services.get(task.name)
        if service is None:
            try:
                service = EvaluationService(task, self.device)
            except (EvalUsageError, OSError):
                if start_only:
                    return None  # an unknown device, or no processes to spare: the evaluation says so itself
                raise
            self._services[task.name] = service
        return service

    def evaluate(self, task: "Task", path: Path, *, heldout: bool = False) -> EvalResult:
        """One evaluation through the task's service."""
        return self._service(task).evaluate(path, heldout=heldout)

    def cancel(self) -> None:
        """Abort the evaluation in progress (its candidate process group is killed at once)."""
        for service in list(self._services.values()):
            service.cancel()

    def close(self) -> None:
        """Stop the services and their waiting candidate processes."""
        for service in self._services.values():
            service.close()
        self._services.clear()


class FunctionEvaluator:
    """An Evaluator from a plain function `fn(task, path, device=..., heldout=...)` (tests, scripts)."""

    def __init__(self, fn: Callable[..., EvalResult], device: str = "cpu") -> None:
        self.fn = fn
        self.device = device

    def evaluate(self, task: "Task", path: Path, *, heldout: bool = False) -> EvalResult:
        """Call the function."""
        return self.fn(task, path, device=self.device, heldout=heldout)

    def cancel(self) -> None:
        """A plain function cannot be interrupted: it runs to its end (Evaluations.abort still refuses new ones)."""

    def close(self) -> None:
        """Nothing to release."""


def ncu_observer(task: "Task", path: Path) -> dict[str, Any]:
    """ncu's kernel list for one call of the task's first CUDA shape (workbench.profiler.observer)."""
    from workbench.profiler import observer

    return observer.check(task.name, path, task.shapes["cuda"][0].name)


def json_safe(value: Any) -> Any:
    """Replace NaN/inf (not JSON) by their names, so a NaN error figure can be journaled and still read."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


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


class Evaluations:
    """Evaluates attempts and journals what came of it (eval.finished, profile.finished)."""

    def __init__(self, evaluator: Evaluator, *, task: "Task", state: "SessionState", files: "SessionFiles",
                 emit: Callable[[str, dict[str, Any]], "Event"], attempt_path: Callable[[int], Path],
                 observer: KernelObserver | None = None) -> None:
        self.evaluator = evaluator
        """Runs each evaluation; closed by close()."""
        self.task = task
        self.state = state
        """The live session state (read)."""
        self.files = files
        """The session folder: attempts/NNNN/result.json, heldout/NNNN.json."""
        self._emit = emit
        self._attempt_path = attempt_path
        self.observer = observer
        """Lists a new best's kernels from outside its process (ncu on CUDA); None skips that check."""
        self.aborted = ""
        """Why evaluations are refused (abort() was called: the run is stopping); '' while they run."""

    def abort(self, reason: str) -> None:
        """Abort the evaluation in progress and refuse new ones (thread-safe): each raises EvalCancelled."""
        self.aborted = self.aborted or reason
        self.evaluator.cancel()

    def _run(self, path: Path, *, heldout: bool = False) -> EvalResult:
        """One evaluation by the evaluator.

        Raises:
            EvalCancelled: abort() was called before or during it.
        """
        if self.aborted:
            raise EvalCancelled(f"{path}: not evaluated: the run is stopping")
        return json_safe(self.evaluator.evaluate(self.task, path, heldout=heldout))

    def evaluate(self, n: int, *, force: bool = False) -> Evaluated:
        """Evaluate attempt n, or answer from the journal when its source was evaluated before (unless force).

        A new best must also pass the held-out shapes (and the observer) before it stands.

        Raises:
            EvalCancelled: the run is stopping (abort()); nothing of this evaluation was journaled, unless it was
                the held-out check of a new best (confirm_best takes it up again on resume).
        """
        if not force:
            done = self._evaluated_twin(self.state.attempts[n])
            if done is not None:
                return Evaluated(journaled_result(done), cached_seq=done.eval_seq)
        path = self._attempt_path(n)
        best_before = self.state.best
        result = self._run(path)
        self.files.write_attempt_result(n, result)  # type: ignore[arg-type]
        self._emit("eval.finished", EvalFinished(attempt=n, result=result))  # type: ignore[arg-type]
        if isinstance(result.get("profile"), dict):
            self._profile(n, result["profile"], best_before)
        if result.get("verdict") == "ok" and self.state.best == n and best_before != n:
            result = self._gate(n, path, result)
        return Evaluated(result)

    def _evaluated_twin(self, attempt: "Attempt") -> "Attempt | None":
        """The attempt itself when it was evaluated, else an evaluated attempt with the same source."""
        if attempt.verdict is not None:
            return attempt
        return next((a for a in self.state.attempts.values() if a.sha256 == attempt.sha256
                     and a.verdict is not None), None)

    def _gate(self, n: int, path: Path, result: EvalResult) -> EvalResult:
        """A new best must also pass the held-out shapes before it stands; the agent never sees their details.

        The journal gets the attempt's public result (its own timings), with the verdict turned into a failure
        when the held-out run fails, and a summary (shape count, passed, held-out speedup). The full result goes to
        heldout/NNNN.json (outside what the agent's tools may read). A failure is an eval.finished that demotes
        the attempt.
        """
        try:
            check = self._run(path, heldout=True)
        except EvalCancelled as exc:
            raise EvalCancelled(f"{exc} (the held-out check of new best attempt {n}: it runs again when the session "
                                "resumes)") from None
        hidden = check.get("heldout") or []
        folder = self.files.dir / HELDOUT_DIR
        folder.mkdir(exist_ok=True)
        write_json_atomic(folder / f"{n:04d}.json", check)
        # The gate is pass/fail: the attempt keeps the timings of its own evaluation, not a second noisy sample.
        public = public_part(result)
        public_ok = all(s.get("correct") is not False for s in check.get("shapes", []))
        passed = check.get("verdict") == "ok" and all(s.get("correct") for s in hidden)
        if not passed:
            public["verdict"] = check.get("verdict") if check.get("verdict") != "ok" else "incorrect"  # type: ignore[typeddict-item]
            public["message"] = (f"failed on held-out shapes (details hidden from the agent, in "
                                 f"{HELDOUT_DIR}/{n:04d}.json)") if public_ok else check.get("message", "")
        observed: dict[str, Any] | None = None
        if passed and self.observer is not None:
            observed = self._observe(path)
            if observed.get("problems"):
                passed = False
                public["verdict"] = "forbidden"
                public["message"] = (f"{path.name}: {observed['problems'][0]} "
                                     "(seen by ncu, outside the candidate process)")
        summary = HeldoutSummary(shapes=len(hidden), passed=passed, speedup=check.get("heldout_speedup"))
        data = EvalFinished(attempt=n, check="heldout", result=public, heldout=summary)
        if observed is not None:
            data["observed"] = observed
        self._emit("eval.finished", data)  # type: ignore[arg-type]
        return public

    def confirm_best(self) -> Evaluated | None:
        """Run the held-out check of a best attempt that never finished one (a stop or a kill cut it short).

        Returns:
            The attempt's evaluation after the check, or None when the best is checked already (or there is none).
        """
        best = self.state.best_attempt
        if best is None or best.checked:
            return None
        try:
            result: EvalResult = json.loads((self.files.attempt_dir(best.n) / "result.json").read_text())
        except (OSError, ValueError):
            result = journaled_result(best)
        return Evaluated(self._gate(best.n, self._attempt_path(best.n), result))

    def _observe(self, path: Path) -> dict[str, Any]:
        """The kernel list of the new best from outside its process; an observer that cannot run is noted, and the
        best stands on the evaluator's own provenance check."""
        assert self.observer is not None
        try:
            return self.observer(self.task, path)
        except Exception as exc:  # noqa: BLE001 - ncu missing or not permitted must not stop a run
            return {"error": f"{type(exc).__name__}: {exc}"[:300]}

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

    def close(self) -> None:
        """Close the evaluator (its prestarted processes or service)."""
        self.evaluator.close()
