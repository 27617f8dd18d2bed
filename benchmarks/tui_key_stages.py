"""Where a key's time to the screen goes: `f` in the workbench TUI (tuner on N CPU slots) and in the bare Textual app
(a headless tuner beside it), each stage timestamped on the machine's monotonic clock.

Run: PYTHONPATH=. python benchmarks/tui_key_stages.py [--workers 2] [--presses 40] [--json FILE]
     PYTHONPATH=. python benchmarks/tui_key_stages.py --pool FILE... (several runs' --json files, pooled)

The app under test runs in a private tmux through this file's --probe mode, which patches Textual (white-box on
purpose: Textual has no hooks for these) to log, for each `f`:
  in       the input thread has parsed the key;
  action   LiveScreen.action_cycle_filter starts and ends (the workbench only);
  resume   the screen's update timer is resumed for the key's repaint;
  start    the frame that shows it (the first after the action) starts rendering;
  frame    that frame is rendered: its wall time, its thread CPU time and the main thread's involuntary context
           switches meanwhile (a preempted frame takes longer than its CPU);
  written  the output thread has written and flushed the frame.
Every other frame drawn meanwhile (the tick's and the panes') is logged with its wall time: a key pressed while one
is drawn waits for it, and then for Textual's next frame step. --json keeps every press's stages and those frames.
The driver logs when it sends the key with `tmux send-keys` and when `tmux capture-pane` first shows the new title
(as benchmarks/tui_responsiveness.py --tmux measures key-to-paint). Medians are of ms since the send.
"""

from __future__ import annotations

import argparse
import json
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
    bare = argv[:1] == ["--bare"]
    if not bare:
        import workbench.ui  # noqa: F401 - before textual, as the CLI imports it, so its frame cap applies
    from textual import events
    from textual.drivers import _writer_thread, linux_driver
    from textual.screen import Screen

    log = open(log_path, "a", buffering=1)
    pending = [False]
    """Set when the key's effect is in the widget tree: the next frame rendered and written is the key's. The
    workbench sets it when its action returns (a tick's frame may come between the key and the action); the bare
    app, which draws nothing else, when the key is read."""

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
        wall, cpu, preempted = now_ms(), time.thread_time(), switches()
        keyed_frame = pending[0]
        if keyed_frame:
            mark("start")
        timer_update(self)
        what = "frame" if keyed_frame else "other"
        mark(f"{what} {now_ms() - wall:.3f} {(time.thread_time() - cpu) * 1000:.3f} {switches() - preempted}")

    from textual.timer import Timer

    timer_resume = Timer.resume

    def resume(self):  # type: ignore[no-untyped-def]
        if pending[0] and self.name == "screen_update" and not self._active.is_set():
            mark("resume")
        return timer_resume(self)

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
    Timer.resume = resume
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


def measure(which: str, workers: int, presses: int,
            folder: Path) -> tuple[list[dict[str, float]], list[float], list[float]]:
    """Press f `presses` times in `which` ('workbench', 'attach' or 'bare'); each press's stages, and the wall ms and
    thread CPU ms of every other frame drawn meanwhile. 'attach' is the TUI following a headless run of the same tuner in another
    process (`workbench attach`): the bare app's load, the TUI's screen, none of the run's threads in its process."""
    from tui_responsiveness import press_latencies, start_load, stop_load, tmux_setup

    folder.mkdir(parents=True, exist_ok=True)

    env, run, tmux = tmux_setup(folder, workers, f"{which}.sock")
    from test_tui_tmux import descendants, kill

    log_path = folder / f"{which}.log"
    log_path.write_text("")
    flags = [item for key, value in env.items() for item in ("-e", f"{key}={value}")]
    probe_argv = [sys.executable, str(Path(__file__).resolve()), "--probe", str(log_path)]
    pids: list[int] = []
    rng = random.Random(11)
    driver_marks: list[tuple[float, str]] = []
    load = None
    try:
        if which == "attach":
            load = start_load(folder, env, run)
            sessions = folder / "load"
            (session,) = [p.name for p in sessions.iterdir() if p.is_dir()]
            tmux("new-session", "-d", "-s", "x", "-x", "120", "-y", "40", "-c", str(REPO), *flags, *probe_argv,
                 "attach", session, "--sessions-dir", str(sessions))
            tmux.wait("x", lambda s: "evaluation · attempt" in s, 240, "the attached TUI following the tuner")
        elif which == "workbench":
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
        if load is not None:
            stop_load(load)
    marks = sorted(driver_marks + [(float(t), rest) for t, _, rest in
                                   (line.partition(" ") for line in log_path.read_text().splitlines())])
    out: list[dict[str, float]] = []
    others: list[float] = []
    others_cpu: list[float] = []
    for t, what in marks:
        name, *values = what.split()
        if name == "other":
            if out:  # drawn after the first press: the start-up's frames are not the load's
                others.append(float(values[0]))
                others_cpu.append(float(values[1]))
        elif name == "send":
            out.append({"send": t})
        elif out and name not in out[-1]:
            out[-1][name] = t - out[-1]["send"]
            if name == "action1" and "action0" in out[-1]:
                out[-1]["action_ms"] = out[-1]["action1"] - out[-1]["action0"]
            if name == "frame":
                out[-1].update(frame_wall=float(values[0]), frame_cpu=float(values[1]),
                               preempted=float(values[2]))
            if name == "start" and "action1" in out[-1]:
                out[-1]["wait"] = out[-1]["start"] - out[-1]["action1"]
    return out, others, others_cpu


def percentile(values: list[float], share: float) -> float:
    """The value `share` of the way up the sorted values (nearest rank, so 1.0 is the max)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def pool(files: list[Path]) -> None:
    """Key-to-paint ('seen') of every press in `files` (this script's --json output, one per run), pooled per app:
    a tail needs more presses than one run has (40 presses give one sample beyond p97.5)."""
    seen: dict[str, list[float]] = {}
    for path in files:
        for which, run in json.loads(path.read_text()).items():
            seen.setdefault(which, []).extend(press["seen"] for press in run["presses"] if "seen" in press)
    shares = (("median", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))
    print(f"| ms after tmux send-keys ({len(files)} runs pooled) | presses | "
          + " | ".join(name for name, _ in shares) + " |")
    print("|---" * (len(shares) + 2) + "|")
    for which, values in seen.items():
        print(f"| {which} | {len(values)} | " + " | ".join(f"{percentile(values, share):.1f}" for _, share in shares)
              + " |")
    if "bare" in seen:
        for which, values in seen.items():
            if which != "bare":
                print(f"| {which} / bare | | " + " | ".join(
                    f"{percentile(values, share) / percentile(seen['bare'], share):.2f}x" for _, share in shares)
                      + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--presses", type=int, default=40)
    parser.add_argument("--json", type=Path, help="also write every press's stages and the other frames here")
    parser.add_argument("--attach", action="store_true",
                        help="also measure the TUI attached to a headless run of the tuner in another process")
    parser.add_argument("--pool", nargs="+", type=Path, metavar="FILE",
                        help="print the key-to-paint percentiles of these --json files' presses, pooled, and exit")
    parser.add_argument("--probe", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe(args.probe[0], args.probe[1:])
        return
    if args.pool:
        pool(args.pool)
        return
    rows = ("in", "action0", "action1", "resume", "start", "frame", "written", "seen", "action_ms", "wait",
            "frame_wall", "frame_cpu", "preempted")
    """Stages as ms after the send ('resume': the screen's update timer is resumed for the key's repaint; 'start' and
    'frame': that frame's render starts and ends), then the action's own ms, the ms from its end to its frame's start,
    the frame's own ms and its involuntary context switches."""
    with tempfile.TemporaryDirectory() as tmp:
        kinds = ("workbench", "attach", "bare") if args.attach else ("workbench", "bare")
        measured = {which: measure(which, args.workers, args.presses, Path(tmp) / which) for which in kinds}
    results = {which: presses for which, (presses, _, _) in measured.items()}
    if args.json:
        args.json.write_text(json.dumps({which: {"presses": presses, "other_frames_ms": others,
                                                 "other_frames_cpu_ms": others_cpu}
                                         for which, (presses, others, others_cpu) in measured.items()}, indent=1))
    names = {"workbench": "workbench TUI", "attach": "TUI attached", "bare": "bare app"}
    print(f"| stage (median ms after tmux send-keys; {args.presses} presses, tuner on {args.workers} CPU slots) | "
          + " | ".join(names[which] for which in kinds) + " |")
    print("|---" * (len(kinds) + 1) + "|")
    for row in rows:
        cells = []
        for which in kinds:
            values = [press[row] for press in results[which] if row in press]
            cells.append(f"{statistics.median(values):.2f}" if values else "")
        print(f"| {row} | {' | '.join(cells)} |")
    waits = [press["wait"] for press in results["workbench"] if "wait" in press]
    print(f"| keys whose frame waited over 2 ms after the action | {sum(w > 2 for w in waits)} of {len(waits)} | |")
    seconds = {which: (presses[-1]["send"] - presses[0]["send"]) / 1000 for which, presses in results.items()}
    cells = [f"{len(others) / seconds[which]:.1f} a second, median {statistics.median(others or [0]):.2f} ms"
             for which, (_, others, _) in measured.items()]
    print(f"| other frames drawn meanwhile | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
