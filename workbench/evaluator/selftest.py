"""The evaluator's self-test: known-bad kernels that must each get the right rejection, known-good ones that must pass.

Run by `workbench doctor --selftest` on the current machine (cpu or cuda) and by tests/test_evaluator.py. A case
names its file in selftest_cases/<task>/, the verdict(s) it must get and a fragment of the message that shows the
right guard fired. Some cases run twice: once as shipped (the static checks reject them) and once with the static
checks off, to prove the run-time guards catch the same cheat on their own.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from workbench.evaluator.service import EvaluationService

CASES_DIR = Path(__file__).resolve().parent / "selftest_cases"
"""Case files ship with the package (a plain folder, never imported: only the candidate worker loads them)."""


@dataclass(frozen=True)
class Case:
    """One self-test candidate and what the evaluator must say about it."""

    name: str
    file: str
    """File name under selftest_cases/<task>/, or "@seed" for the task's own seed kernel."""
    expect: tuple[str, ...]
    """Acceptable verdicts (one, except where several guards race to reject the same cheat)."""
    fragment: str | dict[str, str] | None = None
    """Text the message must contain (per device kind when it differs)."""
    what: str = ""
    """The cheat or failure, in a few words, for the table."""
    task: str = "softmax"
    devices: tuple[str, ...] = ("cpu", "cuda")
    static: bool = True
    """False: evaluate with the static checks off (the run-time guards must catch it alone)."""
    heldout: bool = False
    timeout_s: float | None = None
    check: Callable[[dict[str, Any]], str | None] | None = field(default=None, compare=False)
    """An extra assertion on the result: returns a problem, or None."""


def _stops_at_first_failure(result: dict[str, Any]) -> str | None:
    """Early exit: the first shape fails, every later one is reported as not checked."""
    shapes = result.get("shapes", [])
    if len(shapes) < 2 or shapes[0].get("correct") is not False:
        return "expected the first of every shape to fail, and every shape reported"
    if not all(s.get("correct") is None and "not checked" in (s.get("problem") or "") for s in shapes[1:]):
        return "expected the shapes after the first failure to be left unchecked"
    return None


def _heldout_fails(result: dict[str, Any]) -> str | None:
    if not all(s.get("correct") for s in result.get("shapes", [])):
        return "expected every public shape to pass (only the held-out ones catch this)"
    if not any(s.get("correct") is False for s in result.get("heldout", [])):
        return "expected a held-out shape to fail"
    return None


CASES: list[Case] = [
    # Known-good: these must pass, or the harness rejects honest work.
    Case("seed", "@seed", ("ok",), "correct on", "the task's seed kernel"),
    Case("good_simple", "good_simple.py", ("ok",), "correct on", "one row per program"),
    # Output cheats and plain wrong answers.
    Case("zeros", "zeros.py", ("incorrect",), "rel_rms 1 > tol", "constant zeros"),
    Case("returns_input", "returns_input.py", ("incorrect",), "rel_rms", "returns its input"),
    Case("nan_out", "nan_out.py", ("incorrect",), "NaN/inf", "NaN output"),
    Case("uninit_empty", "uninit_empty.py", ("incorrect",), {"cpu": "shape C1, seed 0", "cuda": "shape S1, seed 0"},
         "unwritten torch.empty"),
    Case("uninit_alias", "uninit_alias.py", ("incorrect",), "seed 1", "stale freed output"),
    Case("mutate_input", "mutate_input.py", ("incorrect",), "modified its input(s) x", "zeroes its input"),
    Case("wrong_shape", "wrong_shape.py", ("incorrect",), "has shape", "wrong shape"),
    Case("wrong_dtype", "wrong_dtype.py", ("incorrect",), "has dtype float64", "wrong dtype"),
    Case("fp16_compute", "fp16_compute.py", ("incorrect",), "rel_rms", "fp16 compute"),
    Case("no_max", "no_max.py", ("incorrect",), "seed 1: output y has", "no max subtraction"),
    Case("off_by_one", "off_by_one.py", ("incorrect",), "incorrect on shape", "drops a column",
         check=_stops_at_first_failure),
    Case("overfit_public", "overfit_public.py", ("incorrect",), "held-out shape", "hard-coded public shapes",
         heldout=True, check=_heldout_fails),
    # Cheats only the timed calls expose.
    Case("caches_results", "caches_results.py", ("incorrect",), "spot check of timed call", "result cache"),
    Case("stateful_drift", "stateful_drift.py", ("incorrect",), "timed call", "goes wrong after 16 calls"),
    Case("replays_pool", "replays_pool.py", ("incorrect",), "spot check of timed call",
         "answers only pooled inputs it has seen"),
    # Provenance: libraries, torch ops, the reference, threads, streams, tampering.
    Case("torch_softmax", "torch_softmax.py", ("forbidden",), "torch.nn.functional.softmax", "torch.softmax"),
    Case("torch_softmax_rt", "torch_softmax.py", ("forbidden",), "aten._softmax", "torch.softmax, run-time check",
         static=False),
    Case("torch_matmul", "torch_matmul.py", ("forbidden",), "aten.mm", "row sums by matmul"),
    Case("sdpa", "sdpa.py", ("forbidden",), "scaled_dot_product_attention", "attention library call"),
    Case("calls_reference", "calls_reference.py", ("forbidden",), "import of 'importlib.util'", "calls the reference"),
    Case("forbidden_import", "forbidden_import.py", ("forbidden",), "import of 'flash_attn'", "kernel library"),
    Case("forbidden_import_rt", "forbidden_import.py", ("forbidden",), "'flash_attn' at run time",
         "kernel library, run-time check", static=False),
    Case("thread_defer", "thread_defer.py", ("forbidden",), "import of 'threading'", "work in a thread"),
    Case("thread_defer_rt", "thread_defer.py", ("forbidden",), "thread(s) running", "work in a thread, run-time",
         static=False),
    Case("lazy_subclass", "lazy_subclass.py", ("forbidden",), "subclasses torch.Tensor", "lazy Tensor subclass"),
    Case("lazy_subclass_rt", "lazy_subclass.py", ("incorrect",), "expected exactly torch.Tensor",
         "lazy Tensor subclass, run-time", static=False),
    Case("patch_timer", "patch_timer.py", ("forbidden",), "import of 'time'", "monkeypatches the timer"),
    Case("patch_timer_rt", "patch_timer.py", ("forbidden",), "time.perf_counter", "timer patch, run-time",
         static=False),
    Case("side_stream", "side_stream.py", ("forbidden",), "torch.cuda.Stream", "side stream"),
    Case("side_stream_rt", "side_stream.py", ("forbidden", "implausible", "incorrect"), None,
         "side stream, run-time (GPU)", devices=("cuda",), static=False),
    # Failures that must be reported, not crash the harness.
    Case("syntax_error", "syntax_error.py", ("compile_error",), "SyntaxError", "syntax error"),
    Case("no_entry", "no_entry.py", ("compile_error",), "defines no callable forward()", "no entry point"),
    Case("triton_compile_error", "triton_compile_error.py", ("compile_error",), "power of 2", "Triton compile error"),
    Case("raises", "raises.py", ("crash",), "RuntimeError: kernel launch failed on purpose", "raises"),
    Case("segfault", "segfault.py", ("crash",), {"cpu": "SIGSEGV", "cuda": "CUDA"}, "out-of-bounds read"),
    Case("hang", "infinite_loop.py", ("timeout",), "no answer after", "never returns", timeout_s=12.0),
    Case("gpu_hang", "gpu_spin.py", ("timeout",), "no answer after", "GPU kernel never finishes",
         devices=("cuda",), timeout_s=30.0),
]
"""The softmax suite. Every row of HARNESS.md's self-test list that can exist for softmax is here."""


@dataclass
class Outcome:
    """What one case got."""

    case: Case
    verdict: str
    message: str
    passed: bool
    problem: str | None
    elapsed_s: float
    result: dict[str, Any] | None


def cases_for(device: str, names: list[str] | None = None) -> list[Case]:
    """The cases that exist on a device kind ("cpu" or "cuda"), optionally only the named ones."""
    chosen = [c for c in CASES if device in c.devices]
    if names:
        unknown = sorted(set(names) - {c.name for c in CASES})
        if unknown:
            raise KeyError(f"unknown self-test case(s): {', '.join(unknown)}")
        chosen = [c for c in chosen if c.name in names]
    return chosen


def case_path(case: Case) -> Path:
    """The candidate file a case evaluates."""
    if case.file == "@seed":
        from workbench.tasks import load_task

        return load_task(case.task).seed
    return CASES_DIR / case.task / case.file


def judge(case: Case, result: dict[str, Any], device: str) -> str | None:
    """Why a result is wrong for its case, or None when it is what the case demands."""
    verdict, message = result.get("verdict"), result.get("message", "")
    if verdict not in case.expect:
        return f"got {verdict}, expected {' or '.join(case.expect)}"
    fragment = case.fragment.get(device) if isinstance(case.fragment, dict) else case.fragment
    if fragment and fragment not in message:
        return f"message lacks {fragment!r}"
    if case.check is not None:
        return case.check(result)
    return None


def run_case(case: Case, device: str, service: "EvaluationService | None" = None) -> Outcome:
    """Evaluate one case (in a fresh candidate process, like any candidate) and judge the result.

    With a service (of the case's task), the case is one evaluation of it; without, a one-shot evaluate().
    """
    from workbench.evaluator import evaluate
    from workbench.tasks import load_task

    started = time.monotonic()
    try:
        if service is not None:
            result = service.evaluate(case_path(case), heldout=case.heldout, timeout_s=case.timeout_s,
                                      static_guards=case.static)
        else:
            result = evaluate(load_task(case.task), case_path(case), device=device, heldout=case.heldout,
                              timeout_s=case.timeout_s, static_guards=case.static)
    except Exception as exc:  # noqa: BLE001 - a harness failure is this case's failure, reported in the table
        return Outcome(case, "error", f"{type(exc).__name__}: {exc}", False, "the evaluator raised",
                       time.monotonic() - started, None)
    problem = judge(case, result, device)
    return Outcome(case, result["verdict"], result.get("message", ""), problem is None, problem,
                   time.monotonic() - started, result)


def run_suite(device: str, *, names: list[str] | None = None, jobs: int | None = None,
              on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run the cases for a device in `jobs` lanes (default 3 on cpu; on cuda up to 4, two CPUs each); outcomes in
    CASES order.

    Each lane keeps one evaluation service per task and feeds it case after case, as an agent run feeds its
    service; every case still gets a fresh candidate process. The hang cases go first: they mostly wait out their
    limit, which then overlaps the other cases.
    """
    from workbench.evaluator.service import EvaluationService, usable_cpus
    from workbench.tasks import load_task

    chosen = cases_for(device, names)
    todo = queue.SimpleQueue()
    for case in sorted(chosen, key=lambda c: c.expect != ("timeout",)):
        todo.put(case)
    outcomes: dict[str, Outcome] = {}
    lock = threading.Lock()
    cpus = usable_cpus()
    if jobs is None:
        # On a GPU concurrent evaluations slow each other's timings, which no verdict here depends on except the
        # side-stream case (whose acceptable verdicts cover it); each lane times on two CPUs of its own.
        jobs = max(1, min(4, len(cpus) // 2)) if device == "cuda" else 3

    def lane(index: int) -> None:
        services: dict[str, EvaluationService] = {}
        mine = cpus[2 * index:2 * index + 2] if len(cpus) >= 2 * (index + 1) else None
        try:
            while True:
                try:
                    case = todo.get_nowait()
                except queue.Empty:
                    return
                if case.task not in services:
                    services[case.task] = EvaluationService(load_task(case.task), device, cpus=mine,
                                                            prepare_heldout=False)
                outcome = run_case(case, device, services[case.task])
                with lock:
                    outcomes[case.name] = outcome
                    if on_outcome:
                        on_outcome(outcome)
        finally:
            for service in services.values():
                service.close()

    lanes = [threading.Thread(target=lane, args=(i,), name=f"selftest-{i}")
             for i in range(max(1, min(jobs, len(chosen))))]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    return [outcomes[c.name] for c in chosen]


def format_table(outcomes: list[Outcome], device: str) -> str:
    """A table: case, what it does, expected and actual verdict, PASS/FAIL, seconds, and the problem if any."""
    header = ["case", "cheat / failure", "expected", "got", "", "s"]
    rows = []
    for o in outcomes:
        rows.append([o.case.name, o.case.what, "|".join(o.case.expect), o.verdict, "PASS" if o.passed else "FAIL",
                     f"{o.elapsed_s:.1f}"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = [f"evaluator self-test on {device}: {sum(o.passed for o in outcomes)}/{len(outcomes)} cases as expected"]
    lines.append("  " + "  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for o, r in zip(outcomes, rows):
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if not o.passed:
            lines.append(f"      {o.problem}: {o.message[:200]}")
    return "\n".join(lines)
