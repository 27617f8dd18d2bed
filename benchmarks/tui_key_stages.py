"""Where a key's time to the screen goes: `f` in the workbench TUI (tuner on N CPU slots) and in the bare Textual app
(a headless tuner beside it), each stage timestamped on the machine's monotonic clock.

Run: PYTHONPATH=. python benchmarks/tui_key_stages.py [--workers 2] [--presses 40]

The app under test runs in a private tmux through this file's --probe mode, which patches Textual (white-box on
purpose: Textual has no hooks for these) to log, for each `f`:
  in       the input thread has parsed the key;
  action   LiveScreen.action_cycle_filter starts and ends (the workbench only);
  frame    the screen's update timer has rendered the frame that shows it (the first after the action): its wall
           time, its thread CPU time and the main thread's involuntary context switches meanwhile (a preempted
           frame takes longer than its CPU);
  written  the output thread has written and flushed the frame.
The driver logs when it sends the key with `tmux send-keys` and when `tmux capture-pane` first shows the new title
(as benchmarks/tui_responsiveness.py --tmux measures key-to-paint). Medians are of ms since the send.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def now_ms() -> float:
    return time.monotonic() * 1000


def probe(log_path: str, argv: list[str]) -> None:
    """Run the workbench CLI (or the bare app and its load for ['--bare', FOLDER, WORKERS]) with Textual patched to
    log each f's stages."""
    from textual import events
    from textual.drivers import _writer_thread, linux_driver
    from textual.screen import Screen

    log = open(log_path, "a", buffering=1)
    pending = [False]
    """Set when the key's effect is in the widget tree: the next frame rendered and written is the key's. The
    workbench sets it when its action returns (a tick's frame may come between the key and the action); the bare
    app, which draws nothing else, when the key is read."""
    bare = argv[:1] == ["--bare"]

    def mark(what: str) -> None:
        log.write(f"{now_ms():.3f} {what}\n")

    process_message = linux_driver.LinuxDriver.process_message

    def keyed(self, message):  # type: ignore[no-untyped-def]
        if isinstance(message, events.Key) and message.key == "f":
            pending[0] = bare
            mark("in")
        return process_message(self, message)

    def switches() -> int:
        for line in open("/proc/thread-self/status"):
            if line.startswith("nonvoluntary_ctxt_switches"):
                return int(line.split()[1])
        return 0

    timer_update = Screen._on_timer_update

    def frame(self):  # type: ignore[no-untyped-def]
        if not pending[0]:
            return timer_update(self)
        wall, cpu, preempted = now_ms(), time.thread_time(), switches()
        timer_update(self)
        mark(f"frame {now_ms() - wall:.3f} {(time.thread_time() - cpu) * 1000:.3f} {switches() - preempted}")

    def write_loop(self):  # type: ignore[no-untyped-def]
        write, flush, get, size = self._file.write, self._file.flush, self._queue.get, self._queue.qsize
        while (text := get()) is not None:
            write(text)
            if size() == 0:
                flush()
                if pending[0]:
                    pending[0] = False
                    mark("written")
        flush()

    linux_driver.LinuxDriver.process_message = keyed
    Screen._on_timer_update = frame
    _writer_thread.WriterThread.run = write_loop
    if bare:
        sys.path.insert(0, str(REPO / "benchmarks"))
        from tui_responsiveness import bare_app

        bare_app(argv[1:])
        return
    from workbench.ui.screens.live import LiveScreen

    cycle = LiveScreen.action_cycle_filter

    def action(self):  # type: ignore[no-untyped-def]
        mark("action0")
        cycle(self)
        mark("action1")
        pending[0] = True

    LiveScreen.action_cycle_filter = action
    import runpy

    sys.argv = ["workbench", *argv]
    runpy.run_module("workbench", run_name="__main__")


def measure(which: str, workers: int, presses: int, folder: Path) -> list[dict[str, float]]:
    """Press f `presses` times in `which` ('workbench' or 'bare') and return each press's stages."""
    from tui_responsiveness import press_latencies, tmux_setup

    env, run, tmux = tmux_setup(folder, workers, f"{which}.sock")
    from test_tui_tmux import descendants, kill

    log_path = folder / f"{which}.log"
    log_path.write_text("")
    flags = [item for key, value in env.items() for item in ("-e", f"{key}={value}")]
    probe_argv = [sys.executable, str(Path(__file__).resolve()), "--probe", str(log_path)]
    pids: list[int] = []
    rng = random.Random(11)
    driver_marks: list[tuple[float, str]] = []
    try:
        if which == "workbench":
            tmux("new-session", "-d", "-s", "x", "-x", "120", "-y", "40", "-c", str(REPO), *flags, *probe_argv,
                 *run, "--sessions-dir", str(folder / "s1"))
            tmux.wait("x", lambda s: "evaluation · attempt" in s and "busy" in s, 240, "the tuner evaluating")
        else:  # the bare app starts the same tuner headless in its session, as the TUI runs it in its own
            tmux("new-session", "-d", "-s", "x", "-x", "120", "-y", "40", "-c", str(REPO), *flags, *probe_argv,
                 "--bare", str(folder), str(workers))
            tmux.wait("x", lambda s: "events" in s, 240, "the bare app and its tuner evaluating")
        press_latencies(tmux, "x", presses, rng, driver_marks)
        pids = descendants(tmux.pid("x"))
    finally:
        tmux("kill-server", check=False)
        kill(pids)
    marks = sorted(driver_marks + [(float(t), rest) for t, _, rest in
                                   (line.partition(" ") for line in log_path.read_text().splitlines())])
    out: list[dict[str, float]] = []
    for t, what in marks:
        name, *values = what.split()
        if name == "send":
            out.append({"send": t})
        elif out and name not in out[-1]:
            out[-1][name] = t - out[-1]["send"]
            if name == "action1" and "action0" in out[-1]:
                out[-1]["action_ms"] = out[-1]["action1"] - out[-1]["action0"]
            if name == "frame":
                out[-1].update(frame_wall=float(values[0]), frame_cpu=float(values[1]),
                               preempted=float(values[2]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--presses", type=int, default=40)
    parser.add_argument("--probe", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe(args.probe[0], args.probe[1:])
        return
    rows = ("in", "action0", "action1", "frame", "written", "seen", "action_ms", "frame_wall", "frame_cpu",
            "preempted")
    """Stages as ms after the send ('frame' is when the frame's render ends), then the action's and the frame's own
    ms and the frame's involuntary context switches."""
    with tempfile.TemporaryDirectory() as tmp:
        results = {which: measure(which, args.workers, args.presses, Path(tmp)) for which in ("workbench", "bare")}
    print(f"| stage (median ms after tmux send-keys; {args.presses} presses, tuner on {args.workers} CPU slots) | "
          "workbench TUI | bare app |")
    print("|---|---|---|")
    for row in rows:
        cells = []
        for which in ("workbench", "bare"):
            values = [press[row] for press in results[which] if row in press]
            cells.append(f"{statistics.median(values):.2f}" if values else "")
        print(f"| {row} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
