"""The one entry point: `workbench <command>`; builds the TUI through the same factory the tests use."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from workbench.journal.events import GoalSet, TaskOrigin

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """A problem the person can fix; printed as one line, exit code attached."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def _sessions_dir(args: argparse.Namespace) -> Path:
    if getattr(args, "sessions_dir", None):
        return Path(args.sessions_dir)
    return Path(os.environ.get("WORKBENCH_SESSIONS") or "sessions")


def _store(args: argparse.Namespace):
    from workbench.session import SessionStore

    return SessionStore(_sessions_dir(args))


def _budget(args: argparse.Namespace, base: dict[str, Any] | None = None):
    from workbench.agent.budget import Budget

    values = dict(base or {})
    flags = {"plateau": "plateau", "roofline_fraction": "roofline-fraction", "context_tokens": "context-budget"}
    for key in ("max_iterations", "max_tool_calls", "max_hours", "max_cost", "max_api_wait", *flags):
        value = getattr(args, key, None)
        if value is not None:
            flag = "--" + flags.get(key, key.replace("_", "-"))
            if value < 0:
                raise CliError(f"{flag} must be >= 0")
            if key == "plateau" and value < 1:
                raise CliError(f"{flag} must be at least 1 attempt")
            if key == "roofline_fraction" and not 0 < value <= 1:
                raise CliError(f"{flag} must be in (0, 1], e.g. 0.8 for 80% of the roofline")
            if key == "context_tokens" and value < 4000:
                raise CliError(f"{flag} must be at least 4000 tokens (the pinned prompt alone is about 2500)")
            values[key] = value
    return Budget.from_dict(values)


def _load_task(name: str):
    from workbench.tasks import TaskError, load_task

    try:
        return load_task(name)
    except TaskError as exc:
        raise CliError(str(exc)) from exc


def _backend(agent: str, task, model: str | None, state=None, start: str | None = None, endpoint=None,
             branches: int = 1):
    """The backend strategy for `agent`, from the registry (one per branch: a list when branches > 1); the seed is
    `start` (run --start), else the kernel the session was started from (a resume rebuilds it from the journal),
    else the task's seed; the endpoint is what a resumed session journaled, overridden by `endpoint` (--base-url,
    --price, --no-stream).

    What the backend needs (its packages, a credential, access to its model) is checked here, before any session
    is created or resumed, so a missing or rejected key is one line and exit 2 rather than a run that dies on its
    first turn.
    """
    from workbench.agent.backends import registry
    from workbench.agent.backends.transport import BackendError

    try:
        spec = registry.get(agent)
    except registry.RegistryError as exc:
        raise CliError(str(exc)) from None
    given = dict(endpoint or {})
    refused = [ENDPOINT_FLAGS[key] for key in given if key not in spec.endpoint_keys]
    if refused:
        raise CliError(f"{', '.join(refused)}: the {agent} agent takes no such setting")
    endpoint = {**(state.endpoint if state is not None else {}), **given}
    try:
        credential = spec.credentials(endpoint)
    except BackendError as exc:  # an endpoint the transport cannot use (a base URL that is not one)
        raise CliError(str(exc)) from None
    if credential is None:
        raise CliError(f"the {agent} agent needs {spec.transport(endpoint).credential_hint}; "  # type: ignore[misc]
                       "or run the offline tuner with --agent tuner")
    missing = registry.missing_packages(spec)
    if missing:
        raise CliError(f"the {agent} agent needs the {', '.join(missing)} package (pip install {' '.join(missing)})")
    seed = start or (state.start_source if state is not None and state.start_source else None) or \
        task.seed.read_text(encoding="utf-8")
    options = registry.BackendOptions(model=model, seed_source=seed, fresh=state is None or not state.attempts,
                                      seed_origin="the --start kernel" if start else str(task.seed),
                                      endpoint=endpoint)
    try:
        spec.check(options)
        backend = spec.create(options)
    except BackendError as exc:
        raise CliError(str(exc)) from None
    if branches > 1 and backend.memory_kind != "messages":
        raise CliError(f"--branches {branches}: the {agent} agent holds no conversation to branch; it keeps one "
                       "evaluation per slot in flight instead (--workers)")
    if spec.transport is not None and backend.model:
        from workbench.agent.backends import reach

        transport = spec.transport(backend.endpoint or endpoint)
        try:
            # A refused connection or a name that does not resolve is known in milliseconds; a host that does not
            # answer would make the access check wait out its own timeout as well.
            warning = reach.check(transport.base_url) or transport.check_access(backend.model)
        except BackendError as exc:
            raise CliError(str(exc)) from None
        if warning:
            print(f"workbench: warning: {warning}", file=sys.stderr)
    return [backend, *(spec.create(options) for _ in range(branches - 1))] if branches > 1 else backend


ENDPOINT_FLAGS = {"base_url": "--base-url", "price": "--price", "stream": "--stream/--no-stream"}
"""Each journal.events.Endpoint key and the flag that sets it."""


def _endpoint_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The endpoint settings given on the command line (journal.events.Endpoint keys; absent when not given)."""
    given: dict[str, Any] = {}
    if args.base_url is not None:
        given["base_url"] = args.base_url
    if args.price is not None:
        try:
            price = [float(p) for p in args.price.split(",")]
        except ValueError:
            price = []
        if len(price) not in (2, 3) or any(not p >= 0 for p in price):
            raise CliError(f"--price {args.price}: give IN,OUT (or IN,OUT,CACHED_IN) in USD per million tokens, "
                           "e.g. --price 0.4,1.6")
        given["price"] = price
    if args.stream is not None:
        given["stream"] = args.stream
    return given


def _pool(task, device: str, workers: int | None, cluster: str):
    """The run's evaluation slots (workbench.fleet.make_pool), made before a session is, so that a bad --workers, a
    busy GPU or a Ray address that does not answer is one line and exit 2: (pool, reference slot)."""
    from workbench.fleet import FleetError, make_pool

    try:
        pool = make_pool(task, device, workers=workers, cluster=None if cluster == "local" else cluster,
                         observer=_observer(device))
    except FleetError as exc:
        raise CliError(str(exc)) from None
    return pool, pool.reference()


def _observer(device: str):
    """The slots' look at a new best's kernels from outside its process: ncu on CUDA, none on the CPU."""
    from workbench.agent.evaluation import ncu_observer

    return ncu_observer if device == "cuda" else None


def _runtime(files, state, task, backend, *, device: str, budget, pool, cluster: str):
    """The runtime for a run, on its pool (built by _pool, owned by the runtime from here)."""
    from workbench.agent.runtime import AgentRuntime

    pool, reference = pool
    return AgentRuntime(files, state, task, backend, device=device, budget=budget, pool=pool, reference=reference,
                        cluster=cluster)


def _device(requested: str | None) -> str:
    from workbench.devices import default_device, gpu_name

    if requested is None:
        return default_device()
    if requested == "cuda" and gpu_name() is None:
        raise CliError("--device cuda: no NVIDIA GPU is visible (nvidia-smi found none); use --device cpu")
    return requested


# -- run / resume --------------------------------------------------------------------------------
def _baseline_name(task) -> str:
    """The baseline's NAME, read without importing it (a baseline may import FLA, which only its process may)."""
    import ast

    from workbench import pyast

    path = getattr(task, "baseline", None)
    if path is None or not Path(path).is_file():
        return "reference (no baseline.py)"
    for node in pyast.parse(Path(path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "NAME" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return Path(path).stem


def _goal(task, device: str, budget: dict[str, Any]) -> GoalSet:
    """The goal contract journaled as goal.set: what the agent may see (no held-out shapes), pinned for the run."""
    from workbench.devices import gpu_name

    return {
        **task.public_view(gpu_name() if device == "cuda" else None),
        "task": task.name,
        "device": device,
        "baseline": _baseline_name(task),
        "metric": "geomean speedup over the shapes, every shape correct within tolerance",
        "budget": budget,
        **_task_origin(task),
    }


def _task_origin(task) -> TaskOrigin:
    """Where the task came from and the hash of its oracle files, journaled so a resume finds and checks it."""
    from workbench.tasks.hashing import task_hash

    return {"task_dir": str(task.dir), "task_hash": task_hash(task.dir)}


def _resume_task(state, accept_change: bool):
    """The task a resumed session runs against, from its journaled folder, checked against its journaled hash.

    Returns:
        (task, changed): the files whose change the person accepted with --accept-task-change (empty when none).
    """
    from workbench.tasks import TaskError, add_tasks_dirs, load_task_dir
    from workbench.tasks.hashing import changed_files, task_hash

    folder, pinned = state.goal.get("task_dir"), state.goal.get("task_hash")
    if not folder:  # a session journaled before task folders were recorded: find the task by name
        print(f"workbench: warning: session {state.id} predates task hashing; cannot tell whether task "
              f"{state.task!r} changed since it started", file=sys.stderr)
        return _load_task(state.task), []
    try:
        task = load_task_dir(folder)
    except TaskError as exc:
        raise CliError(f"session {state.id}: its task {state.task!r} cannot be loaded from {folder}, where it was "
                       f"when the session started: {exc}", EXIT_FAIL) from exc
    add_tasks_dirs([Path(folder).parent])  # so child processes that look the task up by name find this folder
    changed = changed_files(pinned, task_hash(task.dir)) if pinned else []
    if changed and not accept_change:
        raise CliError(f"session {state.id}: task {task.name!r} changed since the session's results were judged "
                       f"({', '.join(changed)} in {folder}); restore them, or resume with --accept-task-change to "
                       f"continue against the new oracle (journaled as a new goal)", EXIT_FAIL)
    return task, changed


def _start_kernel(file: str) -> dict[str, str]:
    """The kernel a run starts from instead of the task's seed: {"file", "sha256", "source"}."""
    from workbench.session.revisions import sha256_text

    path = Path(file)
    try:
        source = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"--start {file}: no such file") from None
    except UnicodeDecodeError:
        raise CliError(f"--start {file}: not UTF-8 text") from None
    except OSError as exc:
        raise CliError(f"--start {file}: cannot read: {exc.strerror}") from None
    try:
        compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise CliError(f"--start {file}:{exc.lineno}: SyntaxError: {exc.msg}") from None
    return {"file": str(path.resolve()), "sha256": sha256_text(source), "source": source}


def cmd_run(args: argparse.Namespace) -> int:
    from workbench.agent.backends import registry
    from workbench.session import SessionStore
    from workbench.session.state import SessionState

    task = _load_task(args.task)
    agent = args.agent or registry.default_name()
    device = _device(args.device)
    budget = _budget(args)
    start = _start_kernel(args.start) if args.start else None
    if args.branches < 1:
        raise CliError("--branches must be at least 1")
    backend = _backend(agent, task, args.model, start=start["source"] if start else None,
                       endpoint=_endpoint_flags(args), branches=args.branches)
    pool = _pool(task, device, args.workers, args.cluster)
    try:
        files = SessionStore(_sessions_dir(args)).create(
            task=task.name, agent=agent, model=args.model, device=device, budget=budget.to_dict()
        )
    except BaseException:
        pool[0].close()
        raise
    runtime = _runtime(files, SessionState(), task, backend, device=device, budget=budget, pool=pool,
                       cluster=args.cluster)
    created = {"id": files.id, "task": task.name, "agent": agent, "model": args.model, "device": device,
               "created": files.meta.get("created", ""), "budget": budget.to_dict(), **_task_origin(task)}
    if start:
        created["start"] = start
    if backend.endpoint is not None:
        created["endpoint"] = backend.endpoint
    runtime.emit("session.created", created)
    runtime.emit("goal.set", _goal(task, device, budget.to_dict()))
    return _drive(runtime, args, files)


def cmd_resume(args: argparse.Namespace) -> int:
    from workbench.session import SessionError
    from workbench.session.replay import load_state

    try:
        files = _store(args).open(args.id, writer=True)
    except SessionError as exc:
        raise CliError(str(exc)) from exc
    if files.journal is not None and files.journal.recovered:
        print(f"workbench: recovered the journal: {files.journal.recovered}", file=sys.stderr)
    state = load_state(files)
    try:
        task, changed = _resume_task(state, args.accept_task_change)
    except CliError:
        files.close()
        raise
    try:
        budget = _budget(args, state.budget)
        backend = _backend(state.agent, task, state.model, state, endpoint=_endpoint_flags(args),
                           branches=state.branches)
        cluster = args.cluster or state.cluster or "local"
        workers = args.workers if args.workers is not None else (state.workers or None)
        if args.workers is None and cluster == "local" and state.device == "cuda" and workers is not None:
            from workbench.fleet.gpus import discover

            free = sum(1 for gpu in discover() if not gpu.busy)
            workers = min(workers, free) or None  # fewer free GPUs here than last time: use them all
        pool = _pool(task, state.device, workers, cluster)
    except CliError:
        files.close()
        raise
    runtime = _runtime(files, state, task, backend, device=state.device, budget=budget, pool=pool, cluster=cluster)
    if changed:
        print(f"workbench: warning: task {task.name!r} changed ({', '.join(changed)}); results before seq "
              f"{state.last_seq + 1} were judged by the old oracle", file=sys.stderr)
        runtime.emit("goal.set", {**_goal(task, state.device, budget.to_dict()), "task_changed": changed})
    return _drive(runtime, args, files)


def _drive(runtime, args: argparse.Namespace, files) -> int:
    """Run headless in this thread, or hand the runtime to the TUI's worker."""
    try:
        if args.headless:
            return _run_headless(runtime, files)
        return _run_tui(runtime, files, args)
    finally:
        runtime.close()
        files.close()


def _run_headless(runtime, files) -> int:
    from workbench.agent.headless import HeadlessSink, say
    from workbench.agent.signals import StopSignals, stop_reason

    say(files.id)
    # SIGTERM, SIGHUP (an SSH hangup without tmux) and SIGINT stop at the next step boundary, or at once during an
    # evaluation; run.stopped names the signal and the session stays resumable.
    signals = StopSignals(lambda signum: runtime.request_stop(stop_reason(signum))).install()
    try:
        runtime.run(threading.Event(), sink=HeadlessSink(runtime.state))
    except Exception as exc:  # the error is journaled by the runtime; say it once and fail
        say(f"workbench: run failed: {type(exc).__name__}: {exc} (session {files.id} is resumable)", sys.stderr)
        return EXIT_FAIL
    finally:
        signals.restore()
    return EXIT_OK


def _settings(args: argparse.Namespace):
    from workbench.config import ConfigError, Settings

    try:
        settings = Settings.load()
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    if getattr(args, "no_mouse", False):
        settings.mouse = False
    return settings


def _run_tui(runtime, files, args: argparse.Namespace) -> int:
    from workbench.ui.factory import make_app

    app = make_app(_settings(args), state=runtime.state, runtime=runtime)
    # The agent's thread (journal, fold) shares the interpreter lock with the UI: a 1 ms switch interval, not 5,
    # lets a key's handler in as soon as the agent's work reaches a switch point.
    sys.setswitchinterval(0.001)
    reason = app.run()
    print(f"session {files.id}: {runtime.state.status} ({reason or runtime.state.stop_reason or 'no stop reason'})"
          f"; resume with: workbench resume {files.id}")
    return EXIT_OK if app.return_code in (None, 0) else EXIT_FAIL


def cmd_attach(args: argparse.Namespace) -> int:
    """Follow a (headless) run's journal read-only in the TUI; nudges go through the session's inbox."""
    from workbench.session import SessionError
    from workbench.session.replay import load_state

    try:
        files = _store(args).open(args.id, writer=False)
    except SessionError as exc:
        raise CliError(str(exc)) from exc
    state = load_state(files)
    from workbench.ui.factory import make_app

    app = make_app(_settings(args), state=state, follow_path=files.events_path,
                   inbox=lambda text, persistent: files.drop_nudge(text, persistent=persistent))
    app.run()
    return EXIT_OK if app.return_code in (None, 0) else EXIT_FAIL


def cmd_review(args: argparse.Namespace) -> int:
    """Browse past sessions read-only in the TUI; with --export, write one session's report.md without a TUI."""
    from workbench.ui.history import HistoryError, load_history, resolve_session_dir

    root = _sessions_dir(args)
    if args.export:
        if not args.id:
            raise CliError("review --export needs a session ID (workbench sessions lists them)")
        from workbench.ui.report import write_report

        try:
            folder = resolve_session_dir(root, args.id)
        except HistoryError as exc:
            raise CliError(str(exc)) from exc
        try:
            history = load_history(folder)
        except HistoryError as exc:  # the session exists but its journal cannot be read
            raise CliError(str(exc), EXIT_FAIL) from exc
        print(write_report(history))
        return EXIT_OK
    if args.id:
        try:
            resolve_session_dir(root, args.id)  # an unknown id is one line here, not an error inside the TUI
        except HistoryError as exc:
            raise CliError(str(exc)) from exc
    elif not root.is_dir():
        raise CliError(f"no sessions folder at {root} (pass --sessions-dir or set WORKBENCH_SESSIONS)")
    from workbench.session.state import SessionState
    from workbench.ui.factory import make_app

    app = make_app(_settings(args), state=SessionState(), review_root=root, review_id=args.id)
    app.run()
    return EXIT_OK if app.return_code in (None, 0) else EXIT_FAIL


# -- inspection ----------------------------------------------------------------------------------
def _summary(state) -> dict[str, Any]:
    best = state.best_attempt
    return {
        "id": state.id, "task": state.task, "agent": state.agent, "model": state.model, "device": state.device,
        "status": state.status, "stop_reason": state.stop_reason, "created": state.created,
        "attempts": len(state.attempts), "evaluated": state.evaluated, "events": state.events,
        "last_seq": state.last_seq, "tool_calls": state.tool_calls, "elapsed_s": round(state.elapsed_at(), 3),
        "best": {"attempt": best.n, "speedup": best.speedup, "ms": best.ms,
                 "timing_comparable": best.timing_comparable} if best else None,
        "budget": state.budget, **({"endpoint": state.endpoint} if state.endpoint else {}),
    }


def cmd_show(args: argparse.Namespace) -> int:
    from workbench.session import SessionError
    from workbench.session.replay import load_state

    try:
        files = _store(args).open(args.id, writer=False)
    except SessionError as exc:
        raise CliError(str(exc)) from exc
    if args.prompt_at is not None:
        return _show_prompt(files, args.prompt_at, args.json, args.branch)
    if args.branch is not None:
        raise CliError("--branch goes with --prompt-at SEQ")
    state = load_state(files)
    summary = _summary(state)
    if args.json:
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    best = summary["best"]
    print(f"{state.id}  task={state.task}  agent={state.agent}  device={state.device}  status={state.status}")
    if state.endpoint:
        price = state.endpoint.get("price")
        print(f"model {state.model} at {state.endpoint.get('base_url')}"
              + (f"  price ${price[0]:g}/${price[1]:g} per million tokens in/out" if price else "  no price set"))
    if state.stop_reason:
        print(f"stop reason: {state.stop_reason}")
    print(f"attempts {summary['attempts']}  tool calls {state.tool_calls}  events {state.events}  "
          f"elapsed {summary['elapsed_s']:.1f} s")
    print(f"best: attempt {best['attempt']} {best['speedup']:.3f}x" if best else "best: none yet")
    for attempt in sorted(state.attempts.values(), key=lambda a: a.n):
        speed = f"{attempt.speedup:.3f}x" if attempt.speedup is not None else "-"
        print(f"  {attempt.n:4d}  {attempt.verdict or 'pending':<13} {speed:>9}  {attempt.note}")
    return EXIT_OK


def _show_prompt(files, seq: int, as_json: bool, branch: int | None = None) -> int:
    """Print the model context at journal seq `seq`, rebuilt from the journal (the last request at or before it, of
    `branch` when given)."""
    from workbench.agent.context import context_at, render_text
    from workbench.session.revisions import sha256_text

    if seq < 1:
        raise CliError("--prompt-at takes a journal seq (1 or more)")
    prompt, memory, request = context_at(files.read_events(), seq, branch)
    if prompt is None:
        # A session without model requests (the tuner): its memory window is what a model would have read.
        lines = [f"no model request at or before seq {seq}; the agent's memory window there:"]
        if memory.summary:
            lines.append(memory.summary)
        lines.extend(" ".join(b.get("text", "") for b in e.content) for e in memory.entries)
        print(json.dumps({"summary": memory.summary, "entries": [e.content for e in memory.entries]}, indent=2)
              if as_json else "\n".join(lines))
        return EXIT_OK
    if as_json:
        print(json.dumps(_request_body(files, prompt, request, seq), indent=2, ensure_ascii=False))
        return EXIT_OK
    of_branch = f"branch {request['branch']}, " if "branch" in request else ""
    print(f"context of {of_branch}turn {request.get('turn')} (llm.request at or before seq {seq}; "
          f"~{request.get('context_tokens', '?')} tokens of a {request.get('budget_tokens', '?')} budget)")
    if request.get("system_sha256") and request["system_sha256"] != sha256_text(prompt.system):
        print("note: this workbench words the system prompt differently from the one that was sent")
    print(render_text(prompt))
    return EXIT_OK


def _request_body(files, prompt, request: dict[str, Any], seq: int) -> dict[str, Any]:
    """The request as the session's model API takes it (its backend's transport); the neutral prompt when the
    backend has no transport or is not installed here."""
    from dataclasses import asdict

    from workbench.agent.backends import registry

    agent = files.meta.get("agent", "")
    try:
        spec = registry.get(agent)
    except registry.RegistryError:
        spec = None
    if spec is None or spec.transport is None:
        return asdict(prompt)
    endpoint: dict[str, Any] = {}  # the one in force when that request was journaled: its run's
    current: dict[str, Any] = {}
    for event in files.read_events():
        if event.seq > seq:
            break
        if event.type in ("session.created", "run.started") and "endpoint" in event.data:
            current = event.data["endpoint"]
        elif event.type == "llm.request":
            endpoint = current
    return spec.transport(endpoint).request_body(prompt, model=request.get("model", ""),
                                                 max_tokens=int(request.get("max_tokens", 0)))


def cmd_sessions(args: argparse.Namespace) -> int:
    rows = _store(args).list()
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return EXIT_OK
    if not rows:
        print(f"no sessions under {_sessions_dir(args)}")
    from workbench.session import summary

    for row in rows:
        if row.get("error"):
            print(f"{row.get('id', '?'):<40} error: {row['error']}")
            continue
        info = summary.of(row)
        speed = f"{info['best_speedup']:.3f}x" if info.get("best_speedup") is not None else "-"
        print(f"{row['id']:<40} {info.get('task', ''):<12} {info.get('agent', ''):<7} "
              f"{info.get('status', ''):<9} attempts {info.get('attempts', 0):<5} best {speed}")
    return EXIT_OK


def cmd_nudge(args: argparse.Namespace) -> int:
    from workbench.session import SessionError

    if not args.text.strip():
        raise CliError("nudge text is empty")
    try:
        files = _store(args).open(args.id, writer=False)
    except SessionError as exc:
        raise CliError(str(exc)) from exc
    path = files.drop_nudge(args.text, persistent=args.persistent)
    print(f"nudge queued for {files.id} ({path.name}); applied at the agent's next step boundary")
    return EXIT_OK


def _candidate(args: argparse.Namespace):
    """The task and candidate file of `eval` and `profile`, both checked: (task, path)."""
    task = _load_task(args.task)
    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"{path}: no such file")
    return task, path


def _evaluate(task, path: Path, **kwargs: Any) -> dict[str, Any]:
    """workbench.evaluator.evaluate, with a usage error (exit 2) or a failed evaluation service (exit 1) as a
    CliError."""
    from workbench.evaluator import EvalServiceError, EvalUsageError, evaluate

    try:
        return evaluate(task, path, **kwargs)
    except EvalUsageError as exc:
        raise CliError(str(exc)) from exc
    except EvalServiceError as exc:  # the trusted side failed twice: not a usage error, not the candidate's verdict
        raise CliError(str(exc), EXIT_FAIL) from exc


def cmd_eval(args: argparse.Namespace) -> int:
    from workbench.evaluator import format_result

    task, path = _candidate(args)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    on_stage = None
    if progress:
        from workbench.stagelog import StageLog

        on_stage = StageLog(sys.stderr)
    result = _evaluate(task, path, device=_device(args.device), heldout=args.heldout, graph=args.graph,
                       on_stage=on_stage)
    print(json.dumps(result, indent=2) if args.json else format_result(result))
    return EXIT_OK if result["verdict"] == "ok" else EXIT_FAIL


def cmd_tasks(args: argparse.Namespace) -> int:
    """List the tasks on the search path with the folder each comes from; broken and shadowed ones say why."""
    from workbench.tasks import TaskError, discover, search_path

    found = discover()
    if not found:
        print("no tasks under " + ", ".join(str(p) for p in search_path()))
        return EXIT_FAIL
    broken = 0
    for entry in found:
        where = f"{entry.folder}" + (" (shipped)" if entry.shipped else "")
        if entry.shadowed_by is not None:
            print(f"{entry.name:<12} shadowed by {entry.shadowed_by}: {where} is not used (rename one)")
        elif isinstance(entry.task, TaskError):
            broken += 1
            print(f"error: {entry.task}")
        else:
            task = entry.task
            shapes = ", ".join(s.name for s in task.shapes.get("cuda", []))
            about = task.description if len(task.description) <= 90 else task.description[:89] + "…"
            print(f"{task.name:<12} {where}  [cuda: {shapes}]\n{'':<13}{about}")
    return EXIT_FAIL if broken else EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from workbench.devices import gpu_name

    import importlib.util

    lines = [f"python      {sys.version.split()[0]}"]
    for module in ("torch", "triton", "numpy", "textual", "anthropic", "openai", "watchfiles", "tomli_w"):
        spec = importlib.util.find_spec(module)
        version = "missing"
        if spec is not None:
            try:
                from importlib.metadata import version as dist_version

                version = dist_version({"tomli_w": "tomli-w"}.get(module, module))
            except Exception:
                version = "installed"
        lines.append(f"{module:<11} {version}")
    gpu = gpu_name()
    lines.append(f"gpu         {gpu or 'none (evaluations run on the CPU under the Triton interpreter)'}")
    for var in ("TERM", "COLORTERM", "TMUX", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
        lines.append(f"{var:<11} {os.environ.get(var, '')}")
    from workbench.agent.backends import registry

    credential = registry.get("claude").credentials()
    lines.append(f"api key     {'set' if credential else 'not set (offline tuner agent)'}")
    lines.append(f"openai key  {'set' if os.environ.get('OPENAI_API_KEY') else 'not set (fine for a local server)'}")
    lines.append(f"sessions    {_sessions_dir(args).resolve()}")
    from workbench.evaluator.forked import report_line
    from workbench.evaluator.isolation import report_lines

    lines += report_lines()
    lines.append(report_line("cuda" if gpu else "cpu"))
    if importlib.util.find_spec("rich") is not None:
        from rich.console import Console

        lines.append(f"colours     {Console().color_system or 'none'} (as Textual will see it)")
    print("\n".join(lines))
    if getattr(args, "selftest", False):
        from workbench.evaluator import selftest

        device = _device(None)
        print(f"running the evaluator self-test on {device} ...", flush=True)
        outcomes = selftest.run_suite(device)
        print(selftest.format_table(outcomes, device))
        return EXIT_OK if all(o.passed for o in outcomes) else EXIT_FAIL
    return EXIT_OK


def cmd_profile(args: argparse.Namespace) -> int:
    from workbench.evaluator import format_result

    task, path = _candidate(args)
    device = _device(None)
    if args.ncu and device != "cuda":
        raise CliError("--ncu needs an NVIDIA GPU (nvidia-smi found none)")
    if args.sanitize and device != "cuda":
        raise CliError("--sanitize needs an NVIDIA GPU (nvidia-smi found none)")
    previous = None
    if args.against:
        try:
            previous = json.loads(Path(args.against).read_text())
        except (OSError, ValueError) as exc:
            raise CliError(f"--against {args.against}: not a readable JSON profile ({exc})") from exc
        previous = previous.get("profile", previous) if isinstance(previous, dict) else None
        if not isinstance(previous, dict):
            raise CliError(f"--against {args.against}: no profile in it")
    if args.shape and args.shape not in [s.name for s in task.shapes.get("cuda", [])]:
        raise CliError(f"--shape {args.shape}: not a CUDA shape of {task.name}")
    result = _evaluate(task, path, device=device)
    from workbench.profiler import advise, diff
    from workbench.profiler.summary import format_profile

    profile = result.get("profile")
    ncu_error = None
    if args.ncu and profile is not None:
        from workbench.profiler import ncu

        shape = args.shape or task.shapes["cuda"][0].name
        try:
            run = ncu.run(task.name, path, shape)
            profile["ncu"] = {k: v for k, v in run.items() if k != "csv"}
        except ncu.NcuError as exc:
            ncu_error = str(exc)
            profile["ncu"] = {"shape": shape, "error": ncu_error}
        profile["findings"] = advise(profile, (result.get("env") or {}).get("sms"))
    elif args.ncu:
        ncu_error = f"ncu skipped: the evaluation ended with verdict {result['verdict']}"
    sanitize_error = None
    if args.sanitize:
        from workbench.evaluator import sanitizer

        shape = args.shape or task.shapes["cuda"][0].name
        try:
            result["sanitizer"] = sanitizer.run(task.name, path, shape, tool=args.sanitize)
        except sanitizer.SanitizerError as exc:
            sanitize_error = str(exc)
            result["sanitizer"] = {"tool": args.sanitize, "shape": shape, "error": sanitize_error}
    if profile is not None and previous is not None:
        profile["deltas"] = diff(previous, profile)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_result(result))
        if profile is None:
            print("profile: kernel tables and roofline need a CUDA GPU run with verdict ok or implausible")
        else:
            print("profile:")
            print("\n".join("  " + line for line in format_profile(profile)))
            if (profile.get("ncu") or {}).get("rows"):
                from workbench.profiler import ncu

                print(f"ncu ({profile['ncu']['shape']}):")
                print("\n".join(ncu.format_rows(profile["ncu"]["rows"])))
            for line in profile.get("deltas") or []:
                print(f"delta: {line}")
        found = result.get("sanitizer") or {}
        if "errors" in found:
            print(f"compute-sanitizer {found['tool']} ({found['shape']}): {found['errors']} error(s)")
            for line in found.get("problems") or []:
                print(f"  {line}")
    if sanitize_error:
        print(f"workbench: compute-sanitizer: {sanitize_error}", file=sys.stderr)
        return EXIT_FAIL
    if (result.get("sanitizer") or {}).get("errors"):
        return EXIT_FAIL
    if ncu_error:
        print(f"workbench: ncu: {ncu_error}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK if result["verdict"] == "ok" else EXIT_FAIL


def _use_tasks_dirs(dirs: list[str], create: bool) -> None:
    """Put --tasks-dir folders on the task search path; commands that create tasks make the folder."""
    from workbench.tasks import add_tasks_dirs

    if create:
        for d in dirs:
            try:
                Path(d).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CliError(f"--tasks-dir {d}: cannot create it: {exc.strerror}") from None
    missing = [d for d in dirs if not Path(d).is_dir()]
    if missing:
        raise CliError(f"--tasks-dir {missing[0]}: no such folder")
    add_tasks_dirs(dirs)


# -- task folders: `task new|check|import`, `export flashinfer-bench` (bodies in workbench.tasks.commands) --------
def _task_command(name: str):
    """A CLI command that runs workbench.tasks.commands.<name>, turning its TaskError into one line and exit 1."""

    def run(args: argparse.Namespace) -> int:
        from workbench.tasks import TaskError, commands

        try:
            return getattr(commands, name)(args)
        except TaskError as exc:
            raise CliError(str(exc), EXIT_FAIL) from exc

    return run


def _task_parsers(sub, tasks_flag) -> None:  # noqa: ANN001 - argparse's private subparsers type
    task = sub.add_parser("task", help="make, import and check task folders (your own kernels)")
    tsub = task.add_subparsers(dest="task_command", required=True)

    p = tsub.add_parser("new", help="a task folder from a PyTorch function and a function making its inputs")
    p.add_argument("name")
    p.add_argument("--from", dest="source", required=True, metavar="FILE:FUNCTION", help="the reference function")
    p.add_argument("--inputs", required=True, metavar="FILE:FUNCTION",
                   help="a function taking the sizes as keyword arguments (defaults: the first shape) and returning "
                        "the reference's arguments")
    p.add_argument("--shape", action="append", metavar="K=V,...",
                   help="a benchmark shape: sizes for the inputs function (repeatable; default: its defaults)")
    p.add_argument("--no-compile-check", action="store_true", help="skip trying torch.compile of the baseline")
    tasks_flag(p, create=True)
    p.set_defaults(func=_task_command("task_new"))

    p = tsub.add_parser("check", help="run a task's reference and baseline on its shapes; list what is wrong")
    p.add_argument("name")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when a GPU is visible")
    p.add_argument("--compile", action="store_true", help="also run (and on a GPU time) the torch.compile baseline")
    p.add_argument("--save-choices", action="store_true",
                   help="on a GPU: record the baseline's autotuning choices in the task's tuned/ folder, so that a "
                        "fresh machine with this GPU model does not autotune it again")
    tasks_flag(p)
    p.set_defaults(func=_task_command("task_check"))

    imp = tsub.add_parser("import", help="task folders from other benchmarks' problem formats")
    isub = imp.add_subparsers(dest="import_format", required=True)
    p = isub.add_parser("kernelbench", help="KernelBench problem files (class Model, get_inputs, get_init_inputs)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--prefix", default="kb_", help="task name prefix (default kb_)")
    p.add_argument("--check", action="store_true", help="also run `task check` on the CPU for each imported task")
    tasks_flag(p, create=True)
    p.set_defaults(func=_task_command("task_import_kernelbench"))
    p = isub.add_parser("flashinfer-bench", help="a FlashInfer-Bench Definition (axes, inputs, outputs, reference run)")
    p.add_argument("definition", metavar="DEFINITION.json")
    p.add_argument("--workloads", metavar="FILE.jsonl", help="its Workloads: the values of its var axes")
    p.add_argument("--name", help="the task's name (default: the definition's)")
    tasks_flag(p, create=True)
    p.set_defaults(func=_task_command("task_import_flashinfer"))

    export = sub.add_parser("export", help="write a session's best attempt in another benchmark's format")
    esub = export.add_subparsers(dest="export_format", required=True)
    p = esub.add_parser("flashinfer-bench", help="a Solution and Traces (TraceSet layout) from a session's best")
    p.add_argument("id", metavar="SESSION")
    p.add_argument("--out", metavar="DIR", help="default: ./flashinfer-bench-<session id>")
    p.add_argument("--sessions-dir", help="sessions folder (default: $WORKBENCH_SESSIONS or ./sessions)")
    tasks_flag(p)
    p.set_defaults(func=_task_command("export_flashinfer"))


# -- parser --------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    from workbench.agent.backends import registry

    parser = argparse.ArgumentParser(prog="workbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def sessions_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument("--sessions-dir", help="sessions folder (default: $WORKBENCH_SESSIONS or ./sessions)")

    def tasks_flag(p: argparse.ArgumentParser, create: bool = False) -> None:
        p.add_argument("--tasks-dir", action="append", metavar="DIR",
                       help="write the new task folder here (default: $WORKBENCH_TASKS, else ./tasks)" if create else
                       "also look for tasks in DIR, after the shipped ones (repeatable; see $WORKBENCH_TASKS)")
        if create:
            p.set_defaults(creates_tasks=True)

    def budget_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--max-iterations", type=int, help="stop after this many attempts evaluated")
        p.add_argument("--max-tool-calls", type=int, help="stop after this many tool calls")
        p.add_argument("--max-hours", type=float, help="stop after this much running time")
        p.add_argument("--max-cost", type=float, help="stop after this much model spend (USD)")
        p.add_argument("--max-api-wait", type=float, metavar="SECONDS",
                       help="stop (resumable) once the model API has kept failing this long; until then failed "
                            "requests are retried, at most 30 s apart (default 3600)")
        p.add_argument("--plateau", type=int, help="stop after N evaluated attempts without a new best")
        p.add_argument("--roofline-fraction", type=float,
                       help="stop once the best reaches this fraction of the roofline floor (0-1, e.g. 0.8)")
        p.add_argument("--context-budget", dest="context_tokens", type=int,
                       help="model-context size (estimated tokens) past which older turns are compacted")

    def fleet_flags(p: argparse.ArgumentParser, resume: bool = False) -> None:
        again = " (default: as the session last ran)" if resume else ""
        p.add_argument("--workers", type=int, metavar="N",
                       help="evaluation slots: evaluations run at once, one per GPU" +
                       (again or " (default: every visible GPU on CUDA, 1 on the CPU)"))
        p.add_argument("--cluster", choices=["local", "ray"], default=None if resume else "local",
                       help="ray: evaluate on a Ray cluster's GPUs (joins RAY_ADDRESS, else starts a local Ray; "
                            "pip install -e '.[cluster]')" + again)

    def endpoint_flags(p: argparse.ArgumentParser, resume: bool = False) -> None:
        again = " (default: what the session journaled)" if resume else ""
        p.add_argument("--base-url", metavar="URL",
                       help="the model server's OpenAI-compatible API, e.g. http://localhost:8000/v1 for vLLM "
                            f"(--agent openai; default: $OPENAI_BASE_URL, else OpenAI's own){again}")
        p.add_argument("--price", metavar="IN,OUT",
                       help="USD per million input and output tokens (optionally IN,OUT,CACHED_IN); without it an "
                            f"openai model's tokens cost 0{again}")
        p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                       help="stream replies as server-sent events (default) or ask for whole ones, for servers that "
                            f"cannot stream tool calls{again}")

    p = sub.add_parser("run", help="start a session on a task")
    p.add_argument("task")
    p.add_argument("--agent", choices=registry.names(),
                   help="default: claude when ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) is set, else the offline "
                        "tuner; openai talks to any OpenAI-compatible server (vLLM, SGLang, Ollama, OpenAI)")
    p.add_argument("--model", help="the model to ask (--agent openai: default the one model the server serves)")
    endpoint_flags(p)
    p.add_argument("--start", metavar="FILE",
                   help="start from this kernel instead of the task's seed, e.g. kernels/kda/kda_chunked.py")
    p.add_argument("--headless", action="store_true", help="no TUI: print one line per attempt")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when a GPU is visible")
    fleet_flags(p)
    p.add_argument("--branches", type=int, default=1, metavar="K",
                   help="run K conversations from the goal at once, sharing the ledger, the best and your nudges "
                        "(LLM agents; default 1)")
    p.add_argument("--no-mouse", action="store_true")
    budget_flags(p)
    sessions_flag(p)
    tasks_flag(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("resume", help="continue a session where it stopped")
    p.add_argument("id")
    p.add_argument("--accept-task-change", action="store_true",
                   help="continue although the task's oracle files changed since the session started (journaled)")
    p.add_argument("--headless", action="store_true")
    p.add_argument("--no-mouse", action="store_true")
    fleet_flags(p, resume=True)
    endpoint_flags(p, resume=True)
    budget_flags(p)
    sessions_flag(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("attach", help="follow a running session's journal in the TUI (nudges via its inbox)")
    p.add_argument("id")
    p.add_argument("--no-mouse", action="store_true")
    sessions_flag(p)
    p.set_defaults(func=cmd_attach)

    p = sub.add_parser("review", help="browse past sessions: attempts, diffs, plots, the ledger at any step")
    p.add_argument("id", nargs="?", help="open this session first (an id or a unique prefix)")
    p.add_argument("--export", action="store_true",
                   help="write the session's report to sessions/<id>/report.md and exit (no TUI)")
    p.add_argument("--no-mouse", action="store_true")
    sessions_flag(p)
    p.set_defaults(func=cmd_review)

    p = sub.add_parser("sessions", help="list sessions")
    p.add_argument("--json", action="store_true")
    sessions_flag(p)
    p.set_defaults(func=cmd_sessions)

    p = sub.add_parser("show", help="one session's summary")
    p.add_argument("id")
    p.add_argument("--json", action="store_true")
    p.add_argument("--prompt-at", type=int, metavar="SEQ",
                   help="print the model context as of journal seq SEQ (rebuilt from the journal)")
    p.add_argument("--branch", type=int, metavar="B",
                   help="with --prompt-at: branch B's context (run --branches; default: the branch of the last "
                        "request at or before SEQ)")
    sessions_flag(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("nudge", help="send a nudge to a running or stopped session")
    p.add_argument("id")
    p.add_argument("text")
    p.add_argument("--persistent", action="store_true", help="keep it in force until revoked")
    sessions_flag(p)
    p.set_defaults(func=cmd_nudge)

    p = sub.add_parser("eval", help="evaluate one candidate file")
    p.add_argument("task")
    p.add_argument("file")
    p.add_argument("--device", choices=["cpu", "cuda"])
    p.add_argument("--json", action="store_true")
    p.add_argument("--heldout", action="store_true",
                   help="also run the task's held-out shapes (what the agent never sees), reported apart")
    p.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                   help="also time both sides under CUDA graphs (default: the task's graph_timing)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="print each step of the evaluation on stderr as it starts (default: when stderr is a "
                        "terminal); a cold baseline can autotune for minutes")
    tasks_flag(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("tasks", help="list tasks and the folder each comes from")
    tasks_flag(p)
    p.set_defaults(func=cmd_tasks)

    p = sub.add_parser("doctor", help="environment report for bug reports")
    sessions_flag(p)
    p.add_argument("--selftest", action="store_true",
                   help="also run the evaluator's self-test of known-bad kernels on this machine (cpu or cuda)")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("profile", help="evaluate a candidate and explain its speed (kernel table, roofline, advice)")
    p.add_argument("task")
    p.add_argument("file")
    p.add_argument("--ncu", action="store_true", help="also run Nsight Compute on one shape (needs a GPU)")
    p.add_argument("--sanitize", choices=["memcheck", "racecheck", "initcheck", "synccheck"],
                   help="also run one call of --shape under compute-sanitizer with this tool (needs a GPU)")
    p.add_argument("--shape", help="the CUDA shape ncu or the sanitizer runs (default: the task's first)")
    p.add_argument("--against", metavar="JSON", help="a previous `workbench profile --json` output to diff against")
    p.add_argument("--json", action="store_true")
    tasks_flag(p)
    p.set_defaults(func=cmd_profile)
    _task_parsers(sub, tasks_flag)
    parser.set_defaults(tasks_dir=None, creates_tasks=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run one command; errors the person can fix are one line on stderr."""
    args = _parser().parse_args(argv)
    try:
        if args.tasks_dir:
            _use_tasks_dirs(args.tasks_dir, create=args.creates_tasks)
        return args.func(args)
    except CliError as exc:
        print(f"workbench: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from workbench.journal import JournalError
        from workbench.session import SessionError

        if isinstance(exc, (JournalError, SessionError)):
            print(f"workbench: {exc}", file=sys.stderr)
            return EXIT_FAIL
        raise


if __name__ == "__main__":
    raise SystemExit(main())
