"""Journal benchmark: fsync'd append rate, replay rate, and resume time of a large synthetic session.

Run: PYTHONPATH=. python benchmarks/journal.py [--events 10000] [--mb 100] [--appends 2000] [--repeat 3]

The synthetic journal is written line by line in the writer's exact format (without an fsync per
line, which would only time the disk), then every figure below goes through the public API. The
page cache is warm, as it is when a session is resumed on the machine that wrote it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from workbench.journal import Journal, read_events
from workbench.journal.record import encode, line_hash, utc_now_ms
from workbench.session import SessionStore

WORDS = "tile warp block mma smem tl.dot fp16 stride mask ✓ \"quoted\" tab\tnew\nline".split(" ")


def _text(rng: random.Random, size: int) -> str:
    out: list[str] = []
    n = 0
    while n < size:
        word = rng.choice(WORDS)
        out.append(word)
        n += len(word) + 1
    return " ".join(out)


def bench_append(folder: Path, n: int) -> dict:
    """Appends of ~1 KB events, each fsync'd before append returns."""
    rng = random.Random(1)
    payload = {"tool": "eval", "text": _text(rng, 900)}
    path = folder / "append" / "events.jsonl"
    path.parent.mkdir()
    latencies = []
    with Journal.open(path, create=True) as journal:
        start = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            journal.append("tool.result", payload)
            latencies.append(time.perf_counter() - t)
        total = time.perf_counter() - start
    latencies.sort()
    return {
        "rate": n / total,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
    }


def synthesize(path: Path, events: int, total_mb: float) -> None:
    """Write a chained journal of `events` lines totalling about `total_mb` MB, as the writer would."""
    rng = random.Random(2)
    per_event = int(total_mb * 1e6 / events)
    # A pool of distinct texts keeps generation fast while lines still differ (the seq and prev do).
    pool = [_text(rng, per_event - 250) for _ in range(64)]
    types = ["llm.response", "tool.call", "tool.result", "eval.finished"]
    prev = ""
    with open(path, "wb") as f:
        for seq in range(1, events + 1):
            data = {"turn": seq, "text": pool[seq % len(pool)], "tokens": rng.randrange(100, 9000)}
            raw = encode(seq, utc_now_ms(), types[seq % len(types)], data, prev)
            f.write(raw + b"\n")
            prev = line_hash(raw)
        f.flush()
        os.fsync(f.fileno())


def timed(fn, repeat: int = 1) -> tuple[float, object]:
    """Best wall time of `repeat` calls (the machine may be shared) and the last call's value."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    return best, value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--appends", type=int, default=2_000)
    parser.add_argument("--tail", type=int, default=100, help="events appended after the checkpoint")
    parser.add_argument("--repeat", type=int, default=3, help="best of N for replay, open and resume")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        folder = Path(tmp)
        rows: list[tuple[str, str, str]] = []

        a = bench_append(folder, args.appends)
        latency = f"p50 {a['p50_ms']:.2f} ms, p99 {a['p99_ms']:.2f} ms"
        rows.append(("append 1 KB + fsync", f"{a['rate']:,.0f} events/s", latency))

        store = SessionStore(folder / "sessions")
        files = store.create(task="softmax", agent="bench", model=None, device="cpu", budget={})
        session_id, path = files.id, files.events_path
        files.close()
        t_gen, _ = timed(lambda: synthesize(path, args.events, args.mb))
        size_mb = path.stat().st_size / 1e6
        shape = f"{args.events:,} events, {size_mb:.1f} MB"
        rows.append(("synthesize", shape, f"{t_gen:.2f} s (not part of resume)"))

        t, n = timed(lambda: sum(1 for _ in read_events(path)), args.repeat)
        rows.append(("replay, verify", f"{size_mb / t:,.0f} MB/s", f"{n / t:,.0f} events/s, {t:.2f} s"))
        t, n = timed(lambda: sum(1 for _ in read_events(path, verify=False)), args.repeat)
        rows.append(("replay, no verify", f"{size_mb / t:,.0f} MB/s", f"{n / t:,.0f} events/s, {t:.2f} s"))

        # session.toml has no anchor past seq 0 yet, so this open hashes every line.
        t, _ = timed(lambda: store.open(session_id, writer=True).close(), args.repeat)
        files = store.open(session_id, writer=True)
        checked = f"{files.journal.last_seq:,} events checked"
        rows.append(("writer open, full verify", f"{t * 1e3:,.0f} ms", checked))
        # The session's checkpoint, then a tail of real (fsync'd) events after it.
        files.write_checkpoint({"status": "running"})
        for i in range(args.tail):
            files.journal.append("tool.result", {"i": i, "text": "t" * 2000})
        files.close()

        def resume() -> tuple[int, int]:
            with store.open(session_id, writer=True) as session:
                usable = session.checkpoint_usable()
                start = session.meta["checkpoint_seq"] + 1 if usable else 1
                tail = sum(1 for _ in session.read_events(start))
                return tail, session.journal.verified_from

        resume()  # the first resume also pays for imports; time the steady one
        t, (tail, verified_from) = timed(resume, args.repeat)
        what = f"hashed from seq {verified_from:,}, read {tail} tail events"
        rows.append(("resume (checkpoint + tail)", f"{t * 1e3:,.1f} ms", what))
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"journal benchmark ({cores} cores, warm page cache, journal sha256 {digest}...)")
    width = max(len(r[0]) for r in rows)
    width2 = max(len(r[1]) for r in rows)
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>{width2}}  {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
