"""Crash safety: SIGKILL a writer at random moments; every acknowledged event survives, torn tails are cut."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from workbench.journal import Journal, read_events

REPO = Path(__file__).resolve().parents[1]
TRIALS = 200

# One process imports the journal once and forks a writer per trial: a fork costs milliseconds where a
# fresh interpreter costs a quarter second, which is what lets 200 kills fit in a few seconds. Each
# writer is still a real process with its own file and flock, killed with a real SIGKILL.
SPAWNER = '''
import hashlib, os, random, sys
from pathlib import Path
from workbench.journal import Journal

def write(path, seed, anchor):
    journal = Journal.open(path, create=True, verified_upto=anchor)
    # os.write: one syscall per report, atomic on a pipe, so a kill never leaves half a number.
    os.write(1, f"ready {os.getpid()}\\n".encode())
    rng = random.Random(seed)
    while True:
        # Mostly small events, some large: a kill inside a megabyte write() is what tears a line.
        pad = "x" * rng.choice((64, 2_000, 20_000, 1_000_000))
        seq = journal.last_seq + 1
        journal.append("tool.result", {"echo": seq, "pad": pad, "sha": hashlib.sha256(pad.encode()).hexdigest()})
        os.write(1, f"{seq}\\n".encode())

for command in sys.stdin:
    seed, seq, offset, digest = command.split() + [""] * (4 - len(command.split()))
    pid = os.fork()
    if pid == 0:
        try:
            write(Path(sys.argv[1]), int(seed), (int(seq), int(offset), digest))
        finally:
            os._exit(1)
    os.waitpid(pid, 0)
    print("dead", flush=True)
'''


def test_sigkill_at_random_moments_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    spawner = subprocess.Popen(
        [sys.executable, "-c", SPAWNER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    rng = random.Random(1234)
    acknowledged: set[int] = set()
    torn_cuts = 0
    anchor = (0, 0, "")
    started = time.monotonic()
    try:
        for trial in range(TRIALS):
            spawner.stdin.write(f"{trial} {anchor[0]} {anchor[1]} {anchor[2]}\n")
            spawner.stdin.flush()
            ready = spawner.stdout.readline().split()
            assert ready and ready[0] == "ready", f"trial {trial}: writer did not start: {ready!r}"
            time.sleep(rng.uniform(0.005, 0.080))
            os.kill(int(ready[1]), signal.SIGKILL)
            for line in iter(spawner.stdout.readline, "dead\n"):
                assert line, "the spawner died"
                acknowledged.add(int(line))
            size_before = path.stat().st_size
            # Always opens (never JournalCorrupt after a crash), checking the whole file every time.
            with Journal.open(path) as journal:
                if journal.recovered:
                    torn_cuts += 1
                    assert path.stat().st_size < size_before
                with open(path, "rb") as f:
                    f.seek(max(path.stat().st_size - 1, 0))
                    assert f.read(1) in (b"", b"\n")
                last = max(acknowledged, default=0)
                assert journal.last_seq >= last, f"trial {trial}: seq {last} acknowledged, journal ends earlier"
                anchor = tuple(journal.anchor().to_dict().values())
            if path.stat().st_size > 16 << 20:
                # Start a fresh file so each reopen stays quick; check everything before dropping it.
                _check_all(path, acknowledged)
                path.unlink()
                acknowledged.clear()
                anchor = (0, 0, "")
    finally:
        spawner.kill()
        spawner.wait()
    if acknowledged:  # empty when the last trial rotated the file away after checking it
        _check_all(path, acknowledged)
    # Where a kill lands is up to the kernel, so this count is shown (with -s), not asserted.
    print(f"\n{TRIALS} kills in {time.monotonic() - started:.1f}s; torn tails cut: {torn_cuts}")


def _check_all(path: Path, acknowledged: set[int]) -> None:
    events = {e.seq: e for e in read_events(path)}
    for seq in acknowledged:
        event = events.get(seq)
        assert event is not None, f"acknowledged seq {seq} is missing"
        assert event.data["echo"] == seq
        assert hashlib.sha256(event.data["pad"].encode()).hexdigest() == event.data["sha"]


def _journal(path: Path, n: int) -> list[bytes]:
    with Journal.open(path, create=True) as journal:
        for i in range(n):
            journal.append("llm.response", {"i": i, "text": "é" * (i * 37 % 300)})
    return path.read_bytes().split(b"\n")[:-1]


def test_truncating_anywhere_leaves_the_complete_lines_before_the_cut(tmp_path: Path) -> None:
    source = tmp_path / "source.jsonl"
    lines = _journal(source, 40)
    data = source.read_bytes()
    ends = []
    pos = 0
    for line in lines:
        pos += len(line) + 1
        ends.append(pos)
    rng = random.Random(7)
    cuts = sorted(set(rng.sample(range(1, len(data)), 60)) | {ends[-1] - 1, ends[-1] - 2, ends[10], ends[10] + 1})
    for cut in cuts:
        path = tmp_path / f"cut{cut}" / "events.jsonl"
        path.parent.mkdir()
        path.write_bytes(data[:cut])
        complete = sum(1 for end in ends if end <= cut)
        # A reader on the torn file sees the complete lines and changes nothing.
        assert [e.seq for e in read_events(path)] == list(range(1, complete + 1))
        assert path.stat().st_size == cut
        with Journal.open(path) as journal:
            assert journal.last_seq == complete
            torn = cut not in ends
            assert (journal.recovered is not None) == torn
            if torn:
                assert f":{complete + 1}: cut a torn final line" in journal.recovered
            assert path.read_bytes() == data[: ends[complete - 1] if complete else 0]
            journal.append("run.resumed", {})
        assert [e.seq for e in read_events(path)] == list(range(1, complete + 2))


def test_sigkill_during_open_recovery_is_safe(tmp_path: Path) -> None:
    """A writer killed while it is itself recovering (cutting a torn tail) leaves a journal that opens."""
    path = tmp_path / "events.jsonl"
    lines = _journal(path, 30)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(3)
    code = "import sys; from workbench.journal import Journal; Journal.open(sys.argv[1])"
    for _ in range(20):
        with open(path, "ab") as f:
            f.write(b'{"seq": 31, "ts": "' + b"z" * rng.randrange(1, 4000))
        proc = subprocess.Popen([sys.executable, "-c", code, str(path)], env=env)
        time.sleep(rng.uniform(0.0, 0.08))
        proc.kill()
        proc.wait()
        with Journal.open(path) as journal:
            assert journal.last_seq == 30
    assert path.read_bytes().split(b"\n")[:-1] == lines
