"""Journal: round trip, hash chain, torn-tail recovery, corruption reports, the writer lock, follow()."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import workbench.journal.journal as journal_module
from workbench.journal import (
    Anchor,
    Journal,
    JournalCorrupt,
    JournalError,
    JournalLocked,
    follow,
    read_events,
)

REPO = Path(__file__).resolve().parents[1]
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def make(path: Path, n: int) -> list[dict]:
    """A journal with n tool.call events; returns their data."""
    datas = [{"i": i, "text": f"line {i} ünïcode"} for i in range(1, n + 1)]
    with Journal.open(path, create=True) as journal:
        for data in datas:
            journal.append("tool.call", data)
    return datas


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def spawn(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


def test_round_trip(path: Path) -> None:
    with Journal.open(path, create=True) as journal:
        assert (journal.last_seq, journal.last_hash, journal.recovered) == (0, "", None)
        written = [journal.append("eval.finished", {"n": i, "nested": {"x": [1.5, None, "é"]}}) for i in range(5)]
    assert [e.seq for e in written] == [1, 2, 3, 4, 5]
    assert all(TS.match(e.ts) for e in written)
    read = list(read_events(path))
    assert read == written
    assert read[2].to_dict() == json.loads(lines_of(path)[2])
    assert list(json.loads(lines_of(path)[0])) == ["seq", "ts", "type", "data", "prev"]


def test_text_without_a_utf8_form_still_round_trips(path: Path) -> None:
    with Journal.open(path, create=True) as journal:
        written = journal.append("tool.result", {"stderr": "bad byte \udcff here", "ok": "é"})
        journal.append("tool.result", {})
    assert list(read_events(path))[0] == written


def test_chain_links_each_line_to_the_sha256_of_the_previous(path: Path) -> None:
    make(path, 4)
    raw = lines_of(path)
    records = [json.loads(line) for line in raw]
    assert records[0]["prev"] == ""
    for before, record in zip(raw, records[1:]):
        assert record["prev"] == hashlib.sha256(before).hexdigest()


def test_reopen_continues_seq_and_chain(path: Path) -> None:
    make(path, 3)
    with Journal.open(path) as journal:
        assert journal.last_seq == 3
        assert journal.verified_from == 1
        assert journal.append("run.resumed", {}).seq == 4
    assert [e.seq for e in read_events(path)] == [1, 2, 3, 4]


def test_open_without_create_refuses_a_missing_file(path: Path) -> None:
    with pytest.raises(JournalError, match="no journal here"):
        Journal.open(path)
    assert not path.exists()


def test_unknown_type_and_non_json_data_are_rejected_and_nothing_is_written(path: Path) -> None:
    with Journal.open(path, create=True) as journal:
        journal.append("goal.set", {"task": "softmax"})
        size = path.stat().st_size
        with pytest.raises(JournalError, match="unknown event type 'goal.changed'"):
            journal.append("goal.changed", {})
        with pytest.raises(JournalError, match="not JSON"):
            journal.append("eval.finished", {"rel_err": float("nan")})
        with pytest.raises(JournalError, match="not JSON"):
            journal.append("eval.finished", {"shapes": {1, 2}})
        with pytest.raises(JournalError, match="must be a dict"):
            journal.append("eval.finished", [1, 2])  # type: ignore[arg-type]
        assert path.stat().st_size == size
        assert journal.append("goal.set", {"task": "mla"}).seq == 2
    assert [e.seq for e in read_events(path)] == [1, 2]


def test_appends_from_many_threads_keep_one_contiguous_chain(path: Path) -> None:
    with Journal.open(path, create=True) as journal:
        threads = [
            threading.Thread(target=lambda t=t: [journal.append("tool.call", {"t": t, "k": k}) for k in range(25)])
            for t in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    events = list(read_events(path))
    assert [e.seq for e in events] == list(range(1, 101))
    assert sorted((e.data["t"], e.data["k"]) for e in events) == [(t, k) for t in range(4) for k in range(25)]


@pytest.mark.parametrize("tail", [b'{"seq": 4, "ts": "2026-11-29T22:1', b"\x00\x00\x00\x00", b'{"seq": 4,\n'])
def test_torn_tail_is_cut_and_reported_on_open(path: Path, tail: bytes) -> None:
    datas = make(path, 3)
    good = path.read_bytes()
    path.write_bytes(good + tail)
    before = path.read_bytes()
    # Readers skip the torn line and leave the file alone.
    assert [e.data for e in read_events(path)] == datas
    assert path.read_bytes() == before
    with Journal.open(path) as journal:
        assert journal.recovered is not None
        assert f"{path}:4:" in journal.recovered and "events 1..3 are intact" in journal.recovered
        assert "\n" not in journal.recovered
        assert journal.last_seq == 3
        assert path.read_bytes() == good
        journal.append("run.resumed", {})
    kept = path.with_name("events.jsonl.torn-4")
    assert kept.read_bytes() == tail
    assert [e.data for e in read_events(path)][:3] == datas
    assert [e.seq for e in read_events(path)] == [1, 2, 3, 4]


def test_clean_open_reports_nothing_recovered(path: Path) -> None:
    make(path, 2)
    with Journal.open(path) as journal:
        assert journal.recovered is None


def _flip(path: Path, line_no: int, old: bytes, new: bytes) -> None:
    lines = lines_of(path)
    assert old in lines[line_no - 1]
    lines[line_no - 1] = lines[line_no - 1].replace(old, new, 1)
    write_lines(path, lines)


def test_flipped_byte_is_corruption_at_the_line_that_no_longer_chains(path: Path) -> None:
    make(path, 5)
    _flip(path, 3, b"line 3", b"line 8")
    before = path.read_bytes()
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(path)
    assert info.value.line == 4
    message = str(info.value)
    assert message.startswith(f"{path}:4: hash chain broken") and "line 3" in message and "\n" not in message
    assert path.read_bytes() == before, "a real break is for a person to look at, never cut"
    with pytest.raises(JournalCorrupt) as info:
        list(read_events(path))
    assert info.value.line == 4


def test_damage_that_breaks_json_before_the_end_is_corruption_not_a_torn_tail(path: Path) -> None:
    make(path, 5)
    _flip(path, 2, b'"data": {', b'"data": [')
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(path)
    assert info.value.line == 2
    assert "not valid JSON" in str(info.value)


def test_flipped_byte_in_a_prev_field(path: Path) -> None:
    make(path, 3)
    record = json.loads(lines_of(path)[1])
    _flip(path, 2, record["prev"][:6].encode(), b"000000")
    with pytest.raises(JournalCorrupt) as info:
        list(read_events(path))
    assert info.value.line == 2


def test_missing_line_is_a_seq_gap(path: Path) -> None:
    make(path, 5)
    lines = lines_of(path)
    write_lines(path, lines[:2] + lines[3:])
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(path)
    assert info.value.line == 3
    assert "seq gap: expected seq 3, found 4" in str(info.value)
    with pytest.raises(JournalCorrupt, match="seq gap"):
        list(read_events(path, verify=False))


def test_duplicated_line_is_out_of_order(path: Path) -> None:
    make(path, 3)
    lines = lines_of(path)
    write_lines(path, lines + [lines[-1]])
    with pytest.raises(JournalCorrupt) as info:
        list(read_events(path))
    assert info.value.line == 4 and "expected seq 4, found 3" in str(info.value)


def test_unknown_type_on_disk_is_corruption(path: Path) -> None:
    make(path, 3)
    _flip(path, 3, b'"type": "tool.call"', b'"type": "tool.kall"')
    with pytest.raises(JournalCorrupt, match="unknown event type 'tool.kall'") as info:
        Journal.open(path)
    assert info.value.line == 3


def test_second_writer_in_another_process_gets_journal_locked(path: Path) -> None:
    make(path, 1)
    holder = spawn(
        """
        import sys
        from pathlib import Path
        from workbench.journal import Journal
        journal = Journal.open(Path(sys.argv[1]))
        print("locked", flush=True)
        sys.stdin.readline()
        """,
        str(path),
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(JournalLocked) as info:
            Journal.open(path)
        message = str(info.value)
        assert f"pid {holder.pid}" in message and str(path) in message and "\n" not in message
        assert info.value.pid == holder.pid
        # Readers need no lock.
        assert [e.seq for e in read_events(path)] == [1]
    finally:
        holder.kill()
        holder.wait()
    # The kernel dropped the dead holder's flock: its lock file is harmless.
    assert (path.parent / "events.lock").exists()
    with Journal.open(path) as journal:
        assert journal.append("run.resumed", {}).seq == 2


def test_same_process_cannot_open_two_writers(path: Path) -> None:
    with Journal.open(path, create=True):
        with pytest.raises(JournalLocked, match="this process"):
            Journal.open(path)
    with Journal.open(path):
        pass


def test_failed_write_rolls_back_and_refuses_further_appends(path: Path, monkeypatch) -> None:
    make(path, 2)
    good = path.read_bytes()
    real_write = os.write
    calls = {"n": 0}

    def half_then_full_disk(fd: int, data) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with Journal.open(path) as journal:
        monkeypatch.setattr(journal_module.os, "write", half_then_full_disk)
        with pytest.raises(JournalError, match="rolled back to seq 2"):
            journal.append("tool.call", {"big": "x" * 1000})
        monkeypatch.undo()
        assert path.read_bytes() == good
        with pytest.raises(JournalError, match="refuses further appends"):
            journal.append("tool.call", {})
    with Journal.open(path) as journal:
        assert journal.recovered is None and journal.last_seq == 2


def test_closed_journal_refuses_appends(path: Path) -> None:
    journal = Journal.open(path, create=True)
    journal.close()
    journal.close()
    with pytest.raises(JournalError, match="closed"):
        journal.append("tool.call", {})


def test_anchor_lets_open_and_read_verify_only_the_tail(path: Path) -> None:
    with Journal.open(path, create=True) as journal:
        for i in range(10):
            journal.append("tool.call", {"i": i})
        anchor = journal.anchor_at(6)
        assert anchor == Anchor(6, len(b"".join(line + b"\n" for line in lines_of(path)[:6])), anchor.hash)
        assert journal.anchor() == Anchor(10, path.stat().st_size, journal.last_hash)
    with Journal.open(path, verified_upto=(anchor.seq, anchor.offset, anchor.hash)) as journal:
        assert (journal.verified_from, journal.anchor_note, journal.last_seq) == (7, None, 10)
    full = list(read_events(path))
    assert list(read_events(path, start_seq=7, verified_upto=anchor.to_dict())) == full[6:]
    # An anchor past start_seq would skip wanted events, so it is ignored.
    assert list(read_events(path, start_seq=3, verified_upto=anchor)) == full[2:]
    # Damage after the anchor is still found.
    _flip(path, 8, b'"i": 7', b'"i": 9')
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(path, verified_upto=anchor)
    assert info.value.line == 9


def test_stale_anchor_falls_back_to_a_full_check(path: Path) -> None:
    make(path, 6)
    with Journal.open(path) as journal:
        anchor = journal.anchor()
    make(path.with_name("other.jsonl"), 6)
    os.replace(path.with_name("other.jsonl"), path)  # same length, different history
    with Journal.open(path, verified_upto=anchor) as journal:
        assert journal.verified_from == 1
        assert "no longer has the anchor's hash" in journal.anchor_note
    path.write_bytes(b"".join(line + b"\n" for line in lines_of(path)[:3]))
    with Journal.open(path, verified_upto=anchor) as journal:
        assert journal.last_seq == 3 and "ends before the anchor" in journal.anchor_note
    with pytest.raises(JournalError, match="not \\(seq, offset, hash\\)"):
        Journal.open(path, verified_upto=(3, -1, "x"))


def test_follow_sees_events_appended_by_another_process(path: Path) -> None:
    make(path, 2)
    stop = threading.Event()
    seen: list[int] = []

    def reader() -> None:
        for event in follow(path, stop=stop, poll_s=0.01):
            seen.append(event.seq)

    thread = threading.Thread(target=reader)
    thread.start()
    writer = spawn(
        """
        import sys, time
        from pathlib import Path
        from workbench.journal import Journal
        with Journal.open(Path(sys.argv[1])) as journal:
            for i in range(30):
                journal.append("tool.result", {"i": i, "pad": "x" * (i * 997)})
                time.sleep(0.002)
        """,
        str(path),
    )
    assert writer.wait(timeout=30) == 0
    deadline = time.monotonic() + 10
    while len(seen) < 32 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert seen == list(range(1, 33))


def test_follow_waits_for_a_partial_line_and_for_the_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    source = tmp_path / "source.jsonl"
    make(source, 3)
    lines = lines_of(source)
    stop = threading.Event()
    seen: list[int] = []
    thread = threading.Thread(
        target=lambda: seen.extend(e.seq for e in follow(path, start_seq=2, stop=stop, poll_s=0.01))
    )
    thread.start()
    time.sleep(0.05)
    with open(path, "ab") as f:
        f.write(lines[0] + b"\n" + lines[1] + b"\n" + lines[2][:20])
        f.flush()
        time.sleep(0.1)
        assert seen == [2], "the partial third line must not be yielded yet"
        f.write(lines[2][20:] + b"\n")
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join(timeout=5)
    assert seen == [2, 3]


def test_follow_reports_a_real_break(path: Path) -> None:
    make(path, 4)
    _flip(path, 2, b"line 2", b"line 7")
    with pytest.raises(JournalCorrupt) as info:
        for _ in follow(path, poll_s=0.01):
            pass
    assert info.value.line == 3


def test_stale_lock_from_a_sigkilled_writer(path: Path) -> None:
    make(path, 1)
    holder = spawn(
        """
        import sys, time
        from pathlib import Path
        from workbench.journal import Journal
        journal = Journal.open(Path(sys.argv[1]))
        print("locked", flush=True)
        time.sleep(60)
        """,
        str(path),
    )
    assert holder.stdout.readline().strip() == "locked"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert (path.parent / "events.lock").read_text().strip() == str(holder.pid)
    with Journal.open(path) as journal:
        assert journal.last_seq == 1


def test_scan_lines_decodes_only_what_is_wanted_but_checks_every_line(path: Path) -> None:
    from workbench.journal.chain import Scan, start_chain

    make(path, 5)
    with open(path, "rb") as f:
        chain, _ = start_chain(f, path, None, verify=True)
        got = [(raw, event) for raw, event in Scan(f, chain).lines(lambda raw: b'"i": 2' in raw)]
    assert [event.seq if event else None for _, event in got] == [None, 2, None, None, 5]  # the last is always
    assert [raw for raw, _ in got] == lines_of(path)
    _flip(path, 3, b"line 3", b"line 8")  # a line never decoded is still hash-checked through its successor
    with open(path, "rb") as f, pytest.raises(JournalCorrupt) as info:
        chain, _ = start_chain(f, path, None, verify=True)
        list(Scan(f, chain).lines(lambda raw: False))
    assert info.value.line == 4
