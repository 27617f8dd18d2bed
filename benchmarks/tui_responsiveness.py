"""TUI responsiveness: review of a 100,000-event session, and key latency while the agent emits 100 events/s; with
--tmux, key-to-paint in a real tmux against a bare Textual app under the same load.

Run: PYTHONPATH=. python benchmarks/tui_responsiveness.py [--events 100000] [--rate 100] [--presses 20]
     PYTHONPATH=. python benchmarks/tui_responsiveness.py --tmux [--workers 2] [--presses 20] [--rounds 2]
     PYTHONPATH=. python benchmarks/tui_responsiveness.py --tmux-cpu [--workers 2] [--seconds 20]

1. A session of --events events is written through the real SessionStore and Journal (one fsync per event, as the
   runtime appends), in a realistic mix: model requests and responses with kernel-sized text, tool calls and results,
   an attempt written and evaluated every 20 events, ledger updates, profiles, nudges and compactions; then one
   checkpoint, as a stopped run leaves it.
2. Review: load_history alone (the worker's work), then the app as `workbench review ID` builds it, timed with Pilot
   from start to the first timeline rows on screen ("open") and to every row added ("complete"); and the session
   list (SessionStore.list, which parses every session.toml) separately.
3. Live: the live screen driven by FloodRuntime at --rate events/s; each key is pressed --presses times at random
   moments, and the latency is the time from sending the key to its effect being in the widget tree (polled every
   millisecond; the frame follows within one refresh).

--tmux: key-to-paint as a person sees it. A private tmux server (its own socket and config, 120x40) runs
`workbench run softmax --agent tuner --device cpu --workers N`, the real TUI with the tuner evaluating on N CPU slots;
`f` (the event log's next filter) is sent with `tmux send-keys` at random moments and the latency is the time until
`tmux capture-pane` shows the log's new title. The same is measured for a bare Textual app (one label that `f`
changes) while a headless run of the same tuner with the same --workers loads the machine the same way: the bare app
starts that run itself, so its evaluation processes are in the bare app's session as the TUI's are in the TUI's
(which matters once their priorities differ: Linux weighs nice values within a session's autogroup). Rounds
alternate the two, so a change in the machine's other load falls on both.

--tmux-cpu: the same TUI run in tmux, and the CPU each of its threads used over --seconds once the tuner evaluates
(from /proc/PID/task/*/stat): the main thread is the one that draws and takes keys.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

if "--bare-app" in sys.argv:
    # The baseline keeps Textual's own frame cap: it is read when textual is first imported, before the imports
    # below bring in workbench.ui, which raises the cap for the workbench's TUI.
    import textual.constants  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.ui.make_softmax_run import result, source  # noqa: E402
from tests.snapshot_apps.fake_runtime import FloodRuntime  # noqa: E402
from tests.snapshot_apps.live_app import make_live_app, settle, ui_settings  # noqa: E402
from workbench.session import SessionStore  # noqa: E402
from textual.app import App, ComposeResult  # noqa: E402 - after workbench.ui (above, via live_app): its frame cap
from textual.widgets import Static  # noqa: E402
from workbench.session.replay import checkpoint_record  # noqa: E402
from workbench.session.state import SessionState, apply  # noqa: E402
from workbench.ui.factory import make_app  # noqa: E402
from workbench.ui.history import load_history  # noqa: E402

LOREM = ("The row max is recomputed per tile; fusing the two passes saves one read of the row, and the rescale "
         "keeps it exact. Next: keep the row in registers when it fits, and check register pressure. ")


def write_session(root: Path, events: int) -> tuple[str, float, int]:
    """Write a session of `events` events through the store's journal; returns (id, seconds, bytes)."""
    rng = random.Random(3)
    budget = {"max_iterations": 100000}
    files = SessionStore(root).create(task="softmax", agent="claude", model="claude-sonnet-4-5",
                                      device="cuda:NVIDIA H200", budget=budget)
    state = SessionState()
    journal = files.journal
    assert journal is not None

    def emit(kind: str, data: dict[str, Any]) -> None:
        apply(state, journal.append(kind, data).to_dict())

    started = time.perf_counter()
    emit("session.created", {"id": files.id, "task": "softmax", "agent": "claude", "model": "claude-sonnet-4-5",
                             "device": "cuda:NVIDIA H200", "created": files.meta["created"], "budget": budget})
    emit("goal.set", {"task": "softmax", "tolerance": {"metric": "rel_rms", "value": 1e-5}, "baseline": "torch"})
    emit("run.started", {"budget": budget, "resumed": False, "agent": "claude", "model": "claude-sonnet-4-5"})
    ledger: list[dict[str, Any]] = []
    n = call = turn = 0
    speed = 0.6
    while state.last_seq < events - 1:
        n += 1
        turn += 1
        block, warps = (256, 512, 1024, 2048, 4096)[n % 5], (4, 8, 16)[n % 3]
        src = source(block, warps, online=n % 2 == 0)
        emit("llm.request", {"turn": turn, "delta": [{"type": "tool_result", "text": LOREM * 4}],
                             "context_tokens": 20000})
        emit("llm.response", {"ok": True, "turn": turn, "content": [{"type": "text", "text": LOREM * 3},
                                                                   {"type": "tool_use", "input": {"source": src}}],
                              "input_tokens": 20000, "output_tokens": 900, "cost_usd": 0.0735})
        for _ in range(6):
            call += 1
            emit("tool.call", {"call_id": f"c{call:06d}", "tool": "read_file", "args": {"path": "reference.py"}})
            emit("tool.result", {"call_id": f"c{call:06d}", "tool": "read_file", "ok": True,
                                 "summary": "reference.py: 1400 chars", "data": {"path": "reference.py"}})
        call += 1
        emit("tool.call", {"call_id": f"c{call:06d}", "tool": "evaluate",
                           "args": {"source_chars": len(src), "note": f"try {n}", "strategy": f"S{1 + n // 50}"}})
        emit("attempt.written", {"attempt": n, "parent": n - 1 if n > 1 else None, "sha256": f"{n:064x}",
                                 "author": "agent", "note": f"BLOCK_SIZE={block}, num_warps={warps}",
                                 "params": {"strategy": f"S{1 + n // 50}"}, "source": src})
        speed = max(0.3, min(2.5, speed * rng.uniform(0.95, 1.06)))
        base = {"S1": 0.0610, "S2": 0.0352, "S3": 0.0148}
        res = result({k: v / speed for k, v in base.items()}) if n % 9 else \
            result(None, verdict="incorrect", bad={"S1": 0.5, "S2": 2e-7, "S3": 0.4}, message="S1 off")
        emit("eval.finished", {"attempt": n, "result": res})
        emit("tool.result", {"call_id": f"c{call:06d}", "tool": "evaluate", "ok": True,
                             "summary": f"attempt {n}: {res['verdict']}", "data": {"attempt": n}})
        if n % 50 == 1:
            ledger = [*ledger[-19:], {"id": f"S{1 + n // 50}", "strategy": f"idea {n // 50}", "status": "trying",
                                      "attempts": []}]
        ledger = [dict(e, attempts=[*e["attempts"][-9:], n]) if e["id"] == f"S{1 + n // 50}" else e for e in ledger]
        emit("ledger.updated", {"ledger": ledger, "change": {"action": "evidence", "id": f"S{1 + n // 50}"}})
        if n % 10 == 0:
            emit("profile.finished", {"attempt": n, "kernels": [{"name": "_softmax_kernel", "calls": 3,
                                                                 "total_ms": 0.07 / speed, "mean_ms": 0.023 / speed,
                                                                 "share": 0.95}], "ncu": {"dram_pct": 60.0}})
        if n % 97 == 0:
            emit("nudge.received", {"id": f"n{n:07d}", "text": "try num_warps=4 on short rows", "persistent": False})
            emit("nudge.acked", {"id": f"n{n:07d}", "note": "ok"})
        if n % 200 == 0:
            emit("memory.compacted", {"number": n // 200, "summary": LOREM * 2, "replaced": [1, state.last_seq]})
    emit("run.stopped", {"reason": "benchmark", "final": False})
    seconds = time.perf_counter() - started
    files.write_checkpoint(checkpoint_record(state), seq=state.last_seq)
    files.close()
    return files.id, seconds, (files.dir / "events.jsonl").stat().st_size


def best_of(repeat: int, fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


async def review_open(root: Path, session_id: str) -> tuple[float, float]:
    """(seconds to the first frame showing timeline rows, seconds to every row added) for `workbench review ID`.

    The first frame is caught by wrapping Screen._compositor_refresh (a probe, white-box on purpose: Pilot has no
    'frame drawn' event); the loop below looks every 50 ms so that it does not compete with the reading thread.
    """
    from textual.screen import Screen

    from workbench.ui.screens.review import ReviewScreen

    frames: list[float] = []
    original = Screen._compositor_refresh

    def probe(screen: Screen) -> None:
        original(screen)
        if isinstance(screen, ReviewScreen) and screen.rows_added and not frames:
            frames.append(time.perf_counter())

    Screen._compositor_refresh = probe  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        app = make_app(ui_settings(), state=SessionState(), review_root=root, review_id=session_id)
        async with app.run_test(size=(120, 40)):
            while True:
                screen = app.screen
                if isinstance(screen, ReviewScreen) and screen.history is not None and frames and \
                        screen.rows_added == len(screen.history.order):
                    complete = time.perf_counter() - started
                    break
                await asyncio.sleep(0.05)
    finally:
        Screen._compositor_refresh = original  # type: ignore[method-assign]
    return frames[0] - started, complete


async def key_latency(rate: float, presses: int) -> tuple[dict[str, list[float]], int, float]:
    """Latency samples per key while FloodRuntime emits `rate` events/s; plus events seen and their rate."""
    from workbench.ui.screens.events import EventListScreen
    from workbench.ui.screens.live import LiveScreen
    from workbench.ui.screens.nudge import NudgeScreen
    from workbench.ui.widgets.event_log import EventLog
    from workbench.ui.widgets.kernel_view import KernelView

    runtime = FloodRuntime(rate=rate)
    app, _ = make_live_app(runtime)
    rng = random.Random(5)
    samples: dict[str, list[float]] = {}
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, runtime)
        started_events, started = app.state.last_seq, time.perf_counter()

        async def measure(name: str, keys: tuple[str, ...], probe: Callable[[], object],
                          ready: Callable[[], bool] = lambda: True,
                          undo: Callable[[], Awaitable[None]] | None = None) -> None:
            """Press `keys` `presses` times; the effect is `probe()` changing and `ready()` holding."""
            for _ in range(presses):
                await asyncio.sleep(rng.uniform(0.05, 0.2))  # let the flood and the flush ticks run
                before = probe()
                sent = time.perf_counter()
                task = asyncio.ensure_future(pilot.press(*keys))
                while probe() == before or not ready():
                    await asyncio.sleep(0.001)
                samples.setdefault(name, []).append((time.perf_counter() - sent) * 1000)
                await task
                if undo is not None:
                    await undo()

        async def close() -> None:
            await pilot.press("escape")
            while not isinstance(app.screen, LiveScreen):
                await asyncio.sleep(0.001)

        kernel = app.screen.query_one(KernelView)
        log = app.screen.query_one(EventLog)
        # d re-renders the kernel pane (difflib and highlighting run in the key's handler).
        await measure("d (kernel: next diff view)", ("d",), lambda: kernel.view)
        # f rewrites the log from the recent-events buffer (up to 5,000 lines).
        await measure("f (event log: next filter)", ("f",), lambda: log.filter)
        await measure("l (event list opens, filled)", ("l",), lambda: type(app.screen),
                      lambda: isinstance(app.screen, EventListScreen) and app.screen.table.row_count > 0
                      and app.screen.table.is_mounted, close)
        await measure("n (nudge dialog opens)", ("n",), lambda: type(app.screen),
                      lambda: isinstance(app.screen, NudgeScreen), close)
        seen = app.state.last_seq - started_events
        seconds = time.perf_counter() - started
        await pilot.press("q")
    return samples, seen, seen / seconds


# -- --tmux: key-to-paint in a real terminal ---------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]
FILTER_TITLES = ("events · filter: attempts + evals (f)", "events · filter: tools (f)",
                 "events · filter: nudges + errors (f)")
"""What the event log's title says under each filter but 'all' (workbench.ui.formatting.EVENT_FILTERS)."""


class BareApp(App[None]):
    """The baseline: a Textual app whose one label `f` cycles through the same four titles as the event log's."""

    BINDINGS = [("f", "next", "next"), ("q", "quit", "quit")]

    def compose(self) -> ComposeResult:
        self.i = 0
        yield Static("events", id="label")

    def action_next(self) -> None:
        self.i = (self.i + 1) % 4
        self.query_one(Static).update(("events", *FILTER_TITLES)[self.i])


def bare_app(load: list[str] | None = None) -> None:
    """Run BareApp; with `load` (a folder, the tuner's workers), the headless tuner started first from this process
    (start_load), and stopped after."""
    running = None
    if load:
        folder = Path(load[0])
        env, run, _ = tmux_setup(folder, int(load[1]), "unused.sock")
        running = start_load(folder, env, run)
    try:
        BareApp().run()
    finally:
        if running is not None:
            stop_load(running)


def title_of(screen: str) -> str:
    """Which filter title the screen shows ('events' when none of the others)."""
    return next((t for t in FILTER_TITLES if t in screen), "events")


def press_latencies(tmux: Any, name: str, presses: int, rng: random.Random,
                    marks: list[tuple[float, str]] | None = None) -> list[float]:
    """Send `f` `presses` times at random moments; ms from send-keys to capture-pane showing the next title. With
    `marks`, each send and each sight is appended to it as (time.monotonic() in ms, "send" or "seen")."""
    out = []
    for _ in range(presses):
        time.sleep(rng.uniform(0.3, 0.8))
        before = title_of(tmux.screen(name))
        sent = time.monotonic()
        tmux("send-keys", "-t", name, "f")
        while title_of(tmux.screen(name)) == before:
            if time.monotonic() - sent > 10:
                raise SystemExit(f"{name}: no change 10 s after f")
        seen = time.monotonic()
        out.append((seen - sent) * 1000)
        if marks is not None:
            marks += [(sent * 1000, "send"), (seen * 1000, "seen")]
    return out


def tmux_setup(folder: Path, workers: int, socket: str = "tmux.sock") -> tuple[dict[str, str], list[str], Any]:
    """The TUI's environment (its own config: a fixed theme, no blink; no API key; 120x40), the tuner's `workbench
    run` arguments on `workers` CPU slots, and a private tmux server whose files live in `folder`."""
    sys.path.insert(0, str(REPO / "tests"))  # the tests' own helpers import each other by module name
    from test_tui_tmux import CONFIG, Tmux

    config = folder / "config.toml"
    config.write_text('theme = "workbench-ansi"\ncursor_blink = false\n')
    env = {"PYTHONPATH": str(REPO), "WORKBENCH_CONFIG": str(config), "ANTHROPIC_API_KEY": "", "COLUMNS": "120",
           "LINES": "40"}
    run = ["run", "softmax", "--agent", "tuner", "--device", "cpu", "--workers", str(workers)]
    (folder / "tmux.conf").write_text(CONFIG)
    return env, run, Tmux(folder / socket, folder / "tmux.conf")


def start_load(folder: Path, env: dict[str, str], run: list[str]) -> subprocess.Popen:
    """A headless run of the same tuner beside the bare app (the same load), in this process's session and a process
    group of its own, returned once both slots evaluate."""
    load = subprocess.Popen([sys.executable, "-m", "workbench", *run, "--headless", "--sessions-dir",
                             str(folder / "load")], cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            text=True, process_group=0)
    assert load.stdout is not None
    load.stdout.readline()  # the session id
    load.stdout.readline()  # the first result: both slots are evaluating by now
    return load


def stop_load(load: subprocess.Popen) -> None:
    """Kill the headless run and every process below it (the evaluator's children run in groups of their own)."""
    from test_tui_tmux import descendants, kill

    pids = descendants(load.pid)
    os.killpg(load.pid, signal.SIGKILL)
    kill(pids)
    load.wait(10)


def tmux_round(folder: Path, workers: int, presses: int, rng: random.Random) -> tuple[list[float], list[float]]:
    """One round: (the workbench's latencies, the bare app's), each under a tuner on `workers` CPU slots."""
    env, run, tmux = tmux_setup(folder, workers)
    from test_tui_tmux import descendants, kill

    try:
        tmux.start("wb", env, *run, "--sessions-dir", str(folder / "s1"))
        tmux.wait("wb", lambda s: "evaluation · attempt" in s and "busy" in s, 240, "the tuner evaluating")
        ours = press_latencies(tmux, "wb", presses, rng)
        kill(descendants(tmux.pid("wb")))
        flags = [item for key, value in env.items() for item in ("-e", f"{key}={value}")]
        tmux("new-session", "-d", "-s", "bare", "-x", "120", "-y", "40", "-c", str(REPO), *flags,
             sys.executable, str(Path(__file__).resolve()), "--bare-app", str(folder), str(workers))
        tmux("kill-session", "-t", "wb")  # after the new session: the server would exit with its last session
        tmux.wait("bare", lambda s: "events" in s, 240, "the bare app and its tuner evaluating")
        bare = press_latencies(tmux, "bare", presses, rng)
        kill(descendants(tmux.pid("bare")))
    finally:
        tmux("kill-server", check=False)
    return ours, bare


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of `pid`, by thread id."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def tmux_cpu_main(workers: int, seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        env, run, tmux = tmux_setup(folder, workers)
        from test_tui_tmux import descendants, kill

        pids: list[int] = []
        try:
            tmux.start("wb", env, *run, "--sessions-dir", str(folder / "s"))
            tmux.wait("wb", lambda s: "evaluation · attempt" in s and "busy" in s, 240, "the tuner evaluating")
            pid = tmux.pid("wb")
            time.sleep(3)
            before, started = thread_cpu(pid), time.monotonic()
            time.sleep(seconds)
            after, elapsed = thread_cpu(pid), time.monotonic() - started
            pids = descendants(pid)
        finally:
            tmux("kill-server", check=False)
            kill(pids)
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    others = sum(v for tid, v in used.items() if tid != pid)
    print(f"| TUI process, tuner on --workers {workers}, {seconds:.0f} s | share of one core |")
    print("|---|---|")
    print(f"| main thread (draws, takes keys) | {100 * used.get(pid, 0.0) / elapsed:.1f}% |")
    print(f"| its {len(used) - 1} other threads (agent, pool, Textual's input and output) | "
          f"{100 * others / elapsed:.1f}% |")


def tmux_main(workers: int, presses: int, rounds: int) -> None:
    rng = random.Random(11)
    ours: list[float] = []
    bare: list[float] = []
    for i in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            o, b = tmux_round(Path(tmp), workers, presses, rng)
        ours += o
        bare += b
        print(f"round {i + 1}: workbench median {statistics.median(o):.0f} ms, bare {statistics.median(b):.0f} ms",
              flush=True)
    print()
    print("| key-to-paint in tmux (f, event log filter) | median | p95 | max |")
    print("|---|---|---|---|")
    for name, values in ((f"workbench TUI, tuner on --workers {workers}", ours),
                         (f"bare Textual app, headless tuner on --workers {workers}", bare)):
        values = sorted(values)
        p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
        print(f"| {name} ({len(values)} presses) | {statistics.median(values):.0f} ms | {p95:.0f} ms | "
              f"{values[-1]:.0f} ms |")
    print(f"| ratio of medians | {statistics.median(ours) / statistics.median(bare):.2f}x | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--presses", type=int, default=20)
    parser.add_argument("--tmux", action="store_true", help="key-to-paint in a real tmux against a bare app")
    parser.add_argument("--tmux-cpu", action="store_true", help="CPU of each thread of the TUI in tmux")
    parser.add_argument("--seconds", type=float, default=20.0, help="with --tmux-cpu: how long to measure")
    parser.add_argument("--workers", type=int, default=2, help="with --tmux: the tuner's evaluation slots")
    parser.add_argument("--rounds", type=int, default=2, help="with --tmux: rounds of both measurements")
    parser.add_argument("--bare-app", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_app is not None:
        bare_app(args.bare_app)
        return
    print(f"machine: {platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · "
          f"{platform.platform()}")
    if args.tmux:
        tmux_main(args.workers, args.presses, args.rounds)
        return
    if args.tmux_cpu:
        tmux_cpu_main(args.workers, args.seconds)
        return
    os.environ["TZ"] = "UTC"
    time.tzset()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "sessions"
        session_id, write_s, size = write_session(root, args.events)
        print(f"wrote {args.events:,} events ({size / 1e6:.1f} MB journal, "
              f"{(root / session_id / 'session.toml').stat().st_size / 1e6:.1f} MB session.toml) in {write_s:.0f} s "
              f"({args.events / write_s:,.0f} fsync'd appends/s)")
        history = load_history(root / session_id)
        attempts = len(history.order)
        load_s = best_of(3, lambda: load_history(root / session_id))
        list_s = best_of(3, lambda: SessionStore(root).list())
        opens = [asyncio.run(review_open(root, session_id)) for _ in range(5)]
        opened, complete = min(opens)
        median_open = statistics.median(o for o, _c in opens)
    samples, seen, rate = asyncio.run(key_latency(args.rate, args.presses))

    print()
    print("| measurement | result | goal |")
    print("|---|---|---|")
    print(f"| load_history, {args.events:,} events, {attempts:,} attempts (best of 3) | {load_s:.2f} s | |")
    print(f"| `review ID`: start to the first frame with timeline rows (best / median of 5) | {opened:.2f} / "
          f"{median_open:.2f} s | < 2 s |")
    print(f"| `review ID`: start to all {attempts:,} timeline rows added | {complete:.2f} s | |")
    print(f"| session list (SessionStore.list, parses the {attempts:,}-attempt checkpoint) | {list_s:.2f} s | |")
    print(f"| events applied while measuring keys | {seen:,} at {rate:.0f}/s | {args.rate:.0f}/s |")
    for name, values in samples.items():
        values.sort()
        p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
        print(f"| key {name}: p50 / p95 / max of {len(values)} | {statistics.median(values):.0f} / {p95:.0f} / "
              f"{values[-1]:.0f} ms | < 100 ms |")


if __name__ == "__main__":
    main()
