"""Session store: atomic TOML, create/open/list, schema versions, attempts, the nudge inbox."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

import workbench.session.atomic as atomic
import workbench.session.store as store_module
from workbench.journal import JournalLocked, read_events
from workbench.session import summary
from workbench.session import SCHEMA_VERSION, SessionError, SessionStore, write_toml_atomic

BUDGET = {"hours": 2.5, "attempts": 40}


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "sessions")


def new(store: SessionStore, task: str = "softmax"):
    return store.create(task=task, agent="claude", model="claude-opus", device="cpu", budget=BUDGET)


def read_toml(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


# -- atomic TOML -------------------------------------------------------------------------------------
def test_write_toml_atomic_round_trips_and_drops_none(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    write_toml_atomic(path, {"a": 1, "b": None, "t": {"x": "é", "y": None}, "l": [1, 2]})
    assert read_toml(path) == {"a": 1, "t": {"x": "é"}, "l": [1, 2]}
    assert os.listdir(tmp_path) == ["a.toml"]


def test_crash_before_replace_leaves_the_old_file_whole(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "session.toml"
    write_toml_atomic(path, {"version": "old", "pad": "o" * 10_000})
    old = path.read_bytes()

    def crash(src, dst):
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(atomic.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        write_toml_atomic(path, {"version": "new", "pad": "n" * 20_000})
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert os.listdir(tmp_path) == ["session.toml"], "no temp file is left behind"
    write_toml_atomic(path, {"version": "new"})
    assert read_toml(path) == {"version": "new"}


def test_crash_while_writing_the_temp_file_leaves_the_old_file(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "session.toml"
    write_toml_atomic(path, {"version": "old"})
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError, match="disk gone"):
        write_toml_atomic(path, {"version": "new"})
    monkeypatch.undo()
    assert read_toml(path) == {"version": "old"}
    assert os.listdir(tmp_path) == ["session.toml"]


def test_untomlable_data_is_a_clear_error_and_the_old_file_stays(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    write_toml_atomic(path, {"a": 1})
    with pytest.raises(ValueError, match="not writable as TOML"):
        write_toml_atomic(path, {"a": [1, None]})
    assert read_toml(path) == {"a": 1}


# -- create / open / list ----------------------------------------------------------------------------
def test_create_makes_the_folder_and_opens_the_writer(store: SessionStore) -> None:
    with new(store, task="Soft Max/v2!") as files:
        assert files.dir == store.root / files.id
        parts = files.id.split("-")
        assert len(parts[0]) == 8 and len(parts[1]) == 6 and files.id.endswith(parts[-1]) and len(parts[-1]) == 4
        assert "-soft-max-v2-" in files.id
        assert sorted(os.listdir(files.dir)) == ["attempts", "events.jsonl", "events.lock", "inbox", "session.toml"]
        meta = read_toml(files.dir / "session.toml")
        assert meta["schema_version"] == SCHEMA_VERSION and meta["id"] == files.id
        identity = (meta["task"], meta["agent"], meta["model"], meta["device"])
        assert identity == ("Soft Max/v2!", "claude", "claude-opus", "cpu")
        assert meta["budget"] == BUDGET and meta["checkpoint_seq"] == 0
        assert files.meta == meta
        assert files.journal.append("session.created", {"task": "softmax"}).seq == 1
    assert not [p for p in os.listdir(store.root) if p.startswith(".")], "no staging folder is left"


def test_create_without_a_model_omits_it(store: SessionStore) -> None:
    with store.create(task="mla", agent="fake", model=None, device="cuda", budget={}) as files:
        assert "model" not in read_toml(files.dir / "session.toml")


def test_ids_are_unique_and_list_is_newest_first(store: SessionStore) -> None:
    ids = []
    for task in ("a", "b", "c"):
        with new(store, task) as files:
            ids.append(files.id)
    assert len(set(ids)) == 3
    listed = store.list()
    assert [m["id"] for m in listed] == sorted(ids, reverse=True)
    assert {m["task"] for m in listed} == {"a", "b", "c"}


def test_open_writer_and_reader(store: SessionStore) -> None:
    with new(store) as files:
        files.journal.append("goal.set", {"x": 1})
        session_id = files.id
        with pytest.raises(JournalLocked):
            store.open(session_id, writer=True)
        reader = store.open(session_id, writer=False)
        assert reader.journal is None
        assert [e.type for e in reader.read_events()] == ["goal.set"]
        with pytest.raises(SessionError, match="read-only"):
            reader.write_checkpoint({})
    with store.open(session_id[:17], writer=True) as files:  # a unique prefix is enough
        assert files.id == session_id and files.journal.last_seq == 1


def test_unknown_id_names_near_matches(store: SessionStore) -> None:
    with new(store) as files:
        session_id = files.id
    typo = session_id[:-1] + ("0" if session_id[-1] != "0" else "1")
    with pytest.raises(SessionError) as info:
        store.open(typo, writer=False)
    message = str(info.value)
    assert f"no session {typo!r}" in message and session_id in message and "\n" not in message
    with pytest.raises(SessionError, match="no session 'zzz'"):
        store.open("zzz", writer=False)
    with pytest.raises(SessionError, match="not a session id"):
        store.open("../etc", writer=False)


def test_ambiguous_prefix(store: SessionStore) -> None:
    new(store, "a").close()
    new(store, "b").close()
    with pytest.raises(SessionError, match="ambiguous"):
        store.open("20", writer=False)


def test_empty_store(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "nothing-here")
    assert store.list() == []
    with pytest.raises(SessionError, match="no sessions there yet"):
        store.open("x", writer=False)


def test_newer_schema_is_refused_and_listed_with_an_error(store: SessionStore) -> None:
    with new(store) as files:
        session_id, path = files.id, files.dir / "session.toml"
    meta = read_toml(path)
    write_toml_atomic(path, {**meta, "schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(SessionError, match="newer workbench") as info:
        store.open(session_id, writer=False)
    assert "\n" not in str(info.value)
    [entry] = store.list()
    assert entry["id"] == session_id and "newer workbench" in entry["error"]


def test_older_schema_is_migrated_explicitly(store: SessionStore, monkeypatch) -> None:
    with new(store) as files:
        session_id, path = files.id, files.dir / "session.toml"
    meta = read_toml(path)
    old = {k: v for k, v in meta.items() if k != "agent"}
    old |= {"schema_version": SCHEMA_VERSION - 1, "agent_name": "claude"}
    write_toml_atomic(path, old)
    monkeypatch.delitem(store_module.MIGRATIONS, SCHEMA_VERSION - 1)
    with pytest.raises(SessionError, match="no migration"):
        store.open(session_id, writer=False)

    def rename_agent(m: dict) -> dict:
        m["agent"] = m.pop("agent_name")
        return m

    monkeypatch.setitem(store_module.MIGRATIONS, SCHEMA_VERSION - 1, rename_agent)
    reader = store.open(session_id, writer=False)
    assert reader.meta["agent"] == "claude" and reader.meta["schema_version"] == SCHEMA_VERSION
    assert read_toml(path)["schema_version"] == SCHEMA_VERSION - 1, "a reader writes nothing"
    with store.open(session_id, writer=True):
        pass
    assert read_toml(path)["schema_version"] == SCHEMA_VERSION and read_toml(path)["agent"] == "claude"


def test_broken_folders_are_listed_not_fatal(store: SessionStore) -> None:
    with new(store) as files:
        good = files.id
    (store.root / "20200101-000000-junk-0000").mkdir()
    (store.root / "20200101-000000-bad-0001").mkdir()
    (store.root / "20200101-000000-bad-0001" / "session.toml").write_text("schema_version = [")
    (store.root / ".20990101-000000-staging.creating").mkdir()
    listed = {m["id"]: m for m in store.list()}
    assert set(listed) == {good, "20200101-000000-junk-0000", "20200101-000000-bad-0001"}
    assert "error" not in listed[good]
    assert "missing" in listed["20200101-000000-junk-0000"]["error"]
    assert "not valid TOML" in listed["20200101-000000-bad-0001"]["error"]


# -- checkpoints -------------------------------------------------------------------------------------
def test_checkpoint_lets_the_next_open_verify_only_the_tail(store: SessionStore) -> None:
    with new(store) as files:
        for i in range(20):
            files.journal.append("tool.call", {"i": i})
        files.write_checkpoint({"status": "running", "best": None, "state": {"attempts": 3}}, seq=15)
        files.journal.append("tool.result", {"i": 20})
        session_id = files.id
    meta = read_toml(store.root / session_id / "session.toml")
    assert meta["checkpoint_seq"] == 15 and meta["schema_version"] == SCHEMA_VERSION
    assert meta["journal"]["seq"] == 15 and meta["task"] == "softmax" and "best" not in meta
    assert meta["state"] == {"attempts": 3}
    with store.open(session_id, writer=True) as files:
        assert files.journal.verified_from == 16 and files.journal.last_seq == 21
        assert files.checkpoint_usable()
        assert [e.seq for e in files.read_events(16)] == [16, 17, 18, 19, 20, 21]
    assert store.open(session_id, writer=False).checkpoint_usable()


def test_checkpoint_of_a_state_object_goes_under_state(store: SessionStore) -> None:
    class State:
        def to_dict(self) -> dict:
            return {"status": "running", "best": 4, "attempts": {"4": {"speedup": 1.7}}}

    with new(store) as files:
        files.journal.append("goal.set", {})
        files.write_checkpoint(State())
        meta = read_toml(files.dir / "session.toml")
    assert meta["state"] == State().to_dict()
    carried = (meta["task"], meta["model"], meta["budget"], meta["checkpoint_seq"])
    assert carried == ("softmax", "claude-opus", BUDGET, 1)
    listed = store.list()[0]
    assert "state" not in listed  # the list reads session.toml only up to [state]
    assert summary.of(listed) == {"task": "softmax", "agent": listed["agent"], "created": listed["created"],
                                  "status": "running", "best": 4, "best_speedup": 1.7, "attempts": 1}


def test_list_reads_only_the_head_and_falls_back_for_older_files(store: SessionStore) -> None:
    class State:
        def to_dict(self) -> dict:
            return {"status": "stopped", "best": 1, "attempts": {"1": {"speedup": 2.5, "source": "x" * 100_000}}}

    with new(store) as files:
        files.journal.append("goal.set", {})
        files.write_checkpoint(State())
        path = files.dir / "session.toml"
    text = path.read_text()
    assert text.index("[summary]") < text.index("[state]")
    # A [state] the list would choke on proves it is never parsed there.
    path.write_text(text.replace("[state]", "[state]\nthis is = = not toml", 1))
    assert summary.of(store.list()[0])["best_speedup"] == 2.5
    # A file from before [summary] existed is read whole and summarised from its state.
    path.write_text(text.replace("[summary]", "[old_summary]", 1))
    assert summary.of(store.list()[0])["best_speedup"] == 2.5


def test_checkpoint_of_a_rewritten_journal_is_not_usable(store: SessionStore) -> None:
    with new(store) as files:
        for i in range(5):
            files.journal.append("tool.call", {"i": i})
        files.write_checkpoint({"status": "running"})
        session_id, events = files.id, files.events_path
    lines = events.read_bytes().split(b"\n")[:-1]
    events.write_bytes(b"".join(line + b"\n" for line in lines[:3]))  # lost its end: state is ahead of it
    assert not store.open(session_id, writer=False).checkpoint_usable()
    with store.open(session_id, writer=True) as files:
        assert files.journal.last_seq == 3 and files.journal.anchor_note is not None
        assert not files.checkpoint_usable()
        with pytest.raises(SessionError, match="beyond the journal"):
            files.write_checkpoint({}, seq=4)


def test_checkpoint_refuses_untomlable_state(store: SessionStore) -> None:
    with new(store) as files:
        before = (files.dir / "session.toml").read_bytes()
        with pytest.raises(SessionError, match="not writable as TOML"):
            files.write_checkpoint({"bad": [None]})
        assert (files.dir / "session.toml").read_bytes() == before


# -- attempts ----------------------------------------------------------------------------------------
def test_attempts_are_written_once_with_a_diff(store: SessionStore) -> None:
    with new(store) as files:
        first = files.write_attempt(1, kernel="a = 1\nb = 2\n", parent_kernel=None, parent=None)
        assert first == files.dir / "attempts" / "0001" == files.attempt_dir(1)
        assert (first / "kernel.py").read_text() == "a = 1\nb = 2\n"
        assert (first / "diff.patch").read_text() == ""
        second = files.write_attempt(2, kernel="a = 1\nb = 3", parent_kernel="a = 1\nb = 2\n", parent=1)
        patch = (second / "diff.patch").read_text()
        assert patch.startswith("--- attempts/0001/kernel.py\n+++ attempts/0002/kernel.py\n")
        assert "-b = 2\n+b = 3\n\\ No newline at end of file\n" in patch
        with pytest.raises(SessionError, match="attempt 1 already exists; attempt numbers are never reused"):
            files.write_attempt(1, kernel="other", parent_kernel=None, parent=None)
        assert (first / "kernel.py").read_text() == "a = 1\nb = 2\n"
        with pytest.raises(SessionError, match="positive integer"):
            files.attempt_dir(0)
        assert sorted(os.listdir(files.attempts_dir)) == ["0001", "0002"]


def test_an_interrupted_attempt_write_leaves_no_attempt(store: SessionStore, monkeypatch) -> None:
    with new(store) as files:
        def crash(src, dst):
            raise KeyboardInterrupt  # stands in for the process dying just before the rename

        monkeypatch.setattr(store_module.os, "rename", crash)
        with pytest.raises(KeyboardInterrupt):
            files.write_attempt(3, kernel="k", parent_kernel=None, parent=None)
        monkeypatch.undo()
        assert os.listdir(files.attempts_dir) == []
        again = files.write_attempt(3, kernel="k", parent_kernel=None, parent=None)
        assert (again / "kernel.py").read_text() == "k"


def test_attempt_results_are_atomic_json(store: SessionStore) -> None:
    with new(store) as files:
        files.write_attempt(1, kernel="k", parent_kernel=None, parent=None)
        files.write_attempt_result(1, {"verdict": "ok", "speedup": 1.5})
        files.write_attempt_result(1, {"verdict": "incorrect"})  # a re-evaluation replaces it
        files.write_attempt_result(1, {"rows": []}, name="profile.json")
        folder = files.attempt_dir(1)
        assert json.loads((folder / "result.json").read_text()) == {"verdict": "incorrect"}
        assert json.loads((folder / "profile.json").read_text()) == {"rows": []}
        with pytest.raises(SessionError, match="does not exist"):
            files.write_attempt_result(7, {})
        for bad in ("kernel.py", "../x.json", ".hidden.json"):
            with pytest.raises(SessionError, match="plain name"):
                files.write_attempt_result(1, {}, name=bad)
        with pytest.raises(SessionError, match="not writable as JSON"):
            files.write_attempt_result(1, {"rel_err": float("nan")})
        assert json.loads((folder / "result.json").read_text()) == {"verdict": "incorrect"}
        assert sorted(os.listdir(folder)) == ["diff.patch", "kernel.py", "profile.json", "result.json"]


# -- inbox -------------------------------------------------------------------------------------------
def test_inbox_round_trip(store: SessionStore) -> None:
    with new(store) as files:
        session_id = files.id
        nudger = store.open(session_id, writer=False)  # `workbench nudge` is a reader
        first = nudger.drop_nudge("try BLOCK=128", persistent=False)
        second = nudger.drop_nudge("never use fp64", persistent=True)
        assert first.parent == files.inbox_dir and first.suffix == ".json" and first.name < second.name
        # Many in a burst (same clock tick) still sort in the order they were dropped.
        burst = [nudger.drop_nudge(f"n{i}", persistent=False) for i in range(50)]
        assert [p.name for p in burst] == sorted(p.name for p in burst)
        with pytest.raises(SessionError, match="needs some text"):
            nudger.drop_nudge("  ", persistent=False)
        with pytest.raises(SessionError, match="read-only"):
            nudger.take_inbox()
        for path in burst:
            path.unlink()
        (files.inbox_dir / "zz-garbage.json").write_text("{not json")
        recorded = []
        taken = files.take_inbox(record=lambda n: recorded.append(files.journal.append("nudge.received", n)))
        assert [n.get("text") for n in taken] == ["try BLOCK=128", "never use fp64", None]
        assert [n.get("persistent") for n in taken[:2]] == [False, True]
        assert taken[0]["id"] == first.stem and "error" in taken[2]
        assert [e.data["text"] for e in recorded] == ["try BLOCK=128", "never use fp64"]
        assert sorted(os.listdir(files.inbox_dir)) == ["zz-garbage.bad"]
        assert files.take_inbox() == []
    assert [e.type for e in read_events(files.events_path)] == ["nudge.received", "nudge.received"]


def test_a_failed_record_keeps_the_nudge_in_the_inbox(store: SessionStore) -> None:
    with new(store) as files:
        files.drop_nudge("keep me", persistent=False)

        def fail(nudge: dict) -> None:
            raise RuntimeError("journal unavailable")

        with pytest.raises(RuntimeError):
            files.take_inbox(record=fail)
        assert [n["text"] for n in files.take_inbox()] == ["keep me"]
