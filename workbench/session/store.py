"""The session store: one folder per session with session.toml, events.jsonl, attempts/ and inbox/."""

from __future__ import annotations

import difflib
import json
import os
import re
import secrets
import shutil
import tempfile
import threading
import tomllib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from workbench.journal import EVENTS_VERSION, Anchor, Event, Journal, JournalError, read_events
from workbench.journal.chain import check_anchor
from workbench.journal.record import utc_now_ms
from workbench.session import summary
from workbench.journal.files import Closing, fsync_dir
from workbench.session.atomic import drop_none, write_json_atomic, write_toml_atomic
from workbench.session.revisions import unified

SCHEMA_VERSION = 2
"""Version of the session.toml layout; bump it with a migration in MIGRATIONS."""


def _drop_cached_state(meta: dict) -> dict:
    """1 -> 2: the cached state predates the fields of the evaluation pool and the starting attempt (Attempt.slot,
    .confirming, .confirmed, .eval_error; the open jobs and slots), which only the journal can tell: the state is
    folded again from it on the next open. The list's fields are kept."""
    state = meta.pop("state", None)
    if isinstance(state, dict) and not isinstance(meta.get("summary"), dict):
        meta["summary"] = summary.summarize(state)
    return meta


MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: _drop_cached_state}
"""Upgrade steps keyed by the version they upgrade from: MIGRATIONS[v] turns a v meta into a v+1 meta.

A session.toml older than SCHEMA_VERSION without a step is refused by name rather than read with guessed meanings.
"""

RESERVED = ("schema_version", "events_version", "id", "checkpoint_seq", "journal", "summary")
"""session.toml keys the store sets itself on every checkpoint."""

_IDENTITY = ("task", "agent", "model", "device", "created", "budget")
"""Fields written at creation, carried into a checkpoint that does not repeat them."""


class SessionError(Exception):
    """A session cannot be created, found, read or written; str() is one line a person can act on."""


def _slug(task: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", task.lower()).strip("-")[:24].strip("-")
    return slug or "session"


def _new_id(task: str) -> str:
    # UTC time first, so ids sort by creation; the random tail separates sessions of the same second.
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{_slug(task)}-{secrets.token_hex(2)}"


def _read_meta(folder: Path) -> tuple[dict, bool]:
    """session.toml of `folder`, migrated to SCHEMA_VERSION; plus whether a migration ran."""
    path = folder / "session.toml"
    try:
        with open(path, "rb") as f:
            meta = tomllib.load(f)
    except FileNotFoundError:
        raise SessionError(f"{path}: missing (not a session folder, or its creation was interrupted)") from None
    except tomllib.TOMLDecodeError as exc:
        raise SessionError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise SessionError(f"{path}: cannot read: {exc.strerror}") from None
    version = meta.get("schema_version")
    if type(version) is not int:
        raise SessionError(f"{path}: schema_version is missing or not an integer")
    if version > SCHEMA_VERSION:
        raise SessionError(
            f"{path}: written by a newer workbench (schema_version {version}, this one reads up to "
            f"{SCHEMA_VERSION}); upgrade workbench to open it"
        )
    events_version = meta.get("events_version", EVENTS_VERSION)
    if type(events_version) is int and events_version > EVENTS_VERSION:
        raise SessionError(
            f"{path}: its events are from a newer workbench (events_version {events_version} > "
            f"{EVENTS_VERSION}); upgrade workbench to open it"
        )
    migrated = version < SCHEMA_VERSION
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise SessionError(f"{path}: schema_version {version} is too old and no migration from it exists")
        meta = step(dict(meta))
        version += 1
        meta["schema_version"] = version
    return meta, migrated


_stamp_lock = threading.Lock()
_last_stamp: datetime | None = None


def _next_stamp() -> datetime:
    """Now in UTC, but always after the previous stamp this process handed out (clocks have coarse ticks)."""
    global _last_stamp
    with _stamp_lock:
        now = datetime.now(timezone.utc)
        if _last_stamp is not None and now <= _last_stamp:
            now = _last_stamp + timedelta(microseconds=1)
        _last_stamp = now
        return now


def _read_head(folder: Path) -> dict:
    """session.toml's head (meta and [summary]) when it has one in the current versions, else the whole file
    through _read_meta (which migrates, and reports any problem in its own words)."""
    try:
        head = summary.read_head(folder / "session.toml")
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        head = None
    current = head is not None and head.get("schema_version") == SCHEMA_VERSION and \
        head.get("events_version", EVENTS_VERSION) == EVENTS_VERSION
    return head if current else _read_meta(folder)[0]


class SessionFiles(Closing):
    """One open session folder: its meta, its journal (writers only) and the files around them."""

    def __init__(self, session_id: str, folder: Path, journal: Journal | None, meta: dict) -> None:
        self.id = session_id
        """The session id (the folder name)."""
        self.dir = folder
        """The session folder."""
        self.journal = journal
        """The writer, or None when opened read-only (read with read_events() or follow())."""
        self.meta = meta
        """session.toml as last read or written."""

    # -- paths -------------------------------------------------------------------------------------
    @property
    def events_path(self) -> Path:
        """The journal file (events.jsonl)."""
        return self.dir / "events.jsonl"

    @property
    def attempts_dir(self) -> Path:
        """attempts/, one numbered folder per kernel version."""
        return self.dir / "attempts"

    @property
    def inbox_dir(self) -> Path:
        """inbox/, where `workbench nudge` drops nudges for the running agent."""
        return self.dir / "inbox"

    @property
    def anchor(self) -> Anchor | None:
        """The journal anchor saved with the last checkpoint (None if none or unreadable)."""
        try:
            return Anchor.coerce(self.meta.get("journal"))
        except JournalError:
            return None

    # -- checkpoint --------------------------------------------------------------------------------
    def checkpoint_usable(self) -> bool:
        """Whether the state cached in session.toml may seed a resume (else fold from seq 1).

        It may when the journal still reaches checkpoint_seq and the saved anchor still matches the
        file, i.e. the history the state was folded from is the history on disk now.
        """
        seq = self.meta.get("checkpoint_seq", 0)
        if type(seq) is not int or seq < 0:
            return False
        anchor = self.anchor
        if self.journal is not None:
            if anchor is not None and anchor.seq > 0 and self.journal.anchor_note is not None:
                return False
            return seq <= self.journal.last_seq
        # A reader cannot afford a full verification here, so without a matching anchor it says no.
        if seq == 0:
            return True
        if anchor is None or anchor.seq != seq:
            return False
        try:
            with open(self.events_path, "rb") as f:
                return check_anchor(f, anchor) is None
        except OSError:
            return False

    def write_checkpoint(self, meta_and_state: Mapping[str, Any] | Any, *, seq: int | None = None) -> None:
        """Replace session.toml with `meta_and_state` plus the store's own keys (RESERVED), atomically.

        Args:
            meta_and_state: the whole meta and derived state as a mapping (None values are dropped:
                TOML has no null), or an object with to_dict() (a SessionState), which is stored as
                the [state] table. Creation fields it lacks (_IDENTITY) are carried over.
            seq: the last seq folded into that state; defaults to the journal's last seq. The journal
                anchor is saved with it when the writer still remembers that position, so the next
                open verifies only what follows.

        Raises:
            SessionError: opened read-only, seq beyond the journal, or the data is not TOML-able.
        """
        journal = self._writer("write a checkpoint")
        if seq is None:
            seq = journal.last_seq
        if not 0 <= seq <= journal.last_seq:
            raise SessionError(
                f"{self.dir}: checkpoint seq {seq} is beyond the journal's last seq {journal.last_seq}"
            )
        if not isinstance(meta_and_state, Mapping):
            meta_and_state = {"state": meta_and_state.to_dict()}
        anchor = journal.anchor_at(seq)
        meta: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "events_version": EVENTS_VERSION,
            "id": self.id,
            "checkpoint_seq": seq,
        }
        meta.update((k, self.meta[k]) for k in _IDENTITY if k in self.meta and k not in meta_and_state)
        for key, value in meta_and_state.items():
            if key in RESERVED or key == "summary":
                continue
            if key == "state" and isinstance(value, Mapping):
                meta["summary"] = summary.summarize(value)  # written ahead of [state]: lists read only this far
            meta[key] = value
        meta["journal"] = anchor.to_dict() if anchor is not None else None
        try:
            write_toml_atomic(self.dir / "session.toml", meta)
        except ValueError as exc:
            raise SessionError(str(exc)) from None
        self.meta = drop_none(meta)

    def read_events(self, start_seq: int = 1) -> Iterator[Event]:
        """The journal's events from start_seq, reading only the tail when the checkpoint anchor allows."""
        return read_events(self.events_path, start_seq=start_seq, verified_upto=self.anchor)

    # -- attempts ----------------------------------------------------------------------------------
    def attempt_dir(self, n: int) -> Path:
        """attempts/0001 for n = 1; the folder may not exist yet."""
        if type(n) is not int or n < 1:
            raise SessionError(f"attempt number must be a positive integer, not {n!r}")
        return self.attempts_dir / f"{n:04d}"

    def write_attempt(self, n: int, *, kernel: str, parent_kernel: str | None, parent: int | None) -> Path:
        """Create attempts/NNNN with kernel.py and diff.patch (unified diff against the parent).

        The folder is filled under a hidden name and renamed into place, so it appears complete or
        not at all (a crash never leaves an attempt without its kernel.py), and rename(2) refuses a
        non-empty target, so an existing attempt is never overwritten. diff.patch is empty when
        there is no parent kernel.

        Raises:
            SessionError: read-only, or attempt n already exists.
        """
        self._writer("write an attempt")
        folder = self.attempt_dir(n)
        taken = SessionError(f"{folder}: attempt {n} already exists; attempt numbers are never reused")
        if folder.exists():
            raise taken
        self.attempts_dir.mkdir(exist_ok=True)
        staged = Path(tempfile.mkdtemp(dir=self.attempts_dir, prefix=f".{folder.name}.", suffix=".tmp"))
        try:
            os.chmod(staged, 0o755)
            for name, text in (("kernel.py", kernel), ("diff.patch", _diff(parent_kernel, kernel, parent, n))):
                with open(staged / name, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
            fsync_dir(staged)
            try:
                os.rename(staged, folder)
            except OSError:
                raise taken from None
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        fsync_dir(self.attempts_dir)
        return folder

    def write_attempt_result(self, n: int, result: dict, name: str = "result.json") -> None:
        """Write (or replace: a re-evaluation wins) one JSON file of attempt n, atomically.

        Raises:
            SessionError: read-only, no such attempt, a name that is not a plain *.json file name,
                or a result that is not strict JSON (map NaN to null first).
        """
        self._writer("write an attempt result")
        folder = self.attempt_dir(n)
        if not folder.is_dir():
            raise SessionError(f"{folder}: attempt {n} does not exist; write_attempt() comes first")
        if Path(name).name != name or not name.endswith(".json") or name.startswith("."):
            raise SessionError(f"{name!r}: a result file must be a plain name ending in .json")
        try:
            write_json_atomic(folder / name, result)
        except ValueError as exc:
            raise SessionError(str(exc)) from None

    # -- nudges ------------------------------------------------------------------------------------
    def drop_nudge(self, text: str, *, persistent: bool) -> Path:
        """Leave a nudge for the running agent in inbox/ (any process may; no lock needed).

        The file name starts with the UTC time in microseconds, strictly increasing within this process (two
        nudges dropped in the same instant keep their order), so name order is arrival order.

        Raises:
            SessionError: empty text.
        """
        if not text.strip():
            raise SessionError("a nudge needs some text")
        self.inbox_dir.mkdir(exist_ok=True)
        stem = f"{_next_stamp():%Y%m%dT%H%M%S%f}Z-{secrets.token_hex(3)}"
        path = self.inbox_dir / f"{stem}.json"
        nudge = {"id": stem, "text": text, "persistent": bool(persistent), "created": utc_now_ms()}
        write_json_atomic(path, nudge)
        return path

    def take_inbox(self, record: Callable[[dict], Any] | None = None) -> list[dict]:
        """Read and remove the nudges waiting in inbox/, oldest first.

        Args:
            record: called with each nudge before its file is removed, e.g. to journal it as
                nudge.received. A crash between the two can deliver a nudge twice, never lose one;
                the nudge's 'id' lets a consumer drop the repeat.

        Returns:
            One dict per file: {'id', 'text', 'persistent', 'created'}; a file that is not a nudge
            comes back as {'id', 'error'} and is renamed to *.bad so it is kept but not retried.

        Raises:
            SessionError: opened read-only (only the writer consumes the inbox).
        """
        self._writer("take the inbox")
        taken: list[dict] = []
        if not self.inbox_dir.is_dir():
            return taken
        for path in sorted(self.inbox_dir.glob("*.json")):
            try:
                nudge = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(nudge, dict) or not isinstance(nudge.get("text"), str):
                    raise ValueError("not an object with a 'text' string")
            except FileNotFoundError:
                continue
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                os.replace(path, path.with_suffix(".bad"))
                taken.append({"id": path.stem, "error": f"{path.name}: not a nudge ({reason})"})
                continue
            nudge.setdefault("id", path.stem)
            nudge["persistent"] = bool(nudge.get("persistent", False))
            if record is not None:
                record(nudge)
            path.unlink(missing_ok=True)
            taken.append(nudge)
        return taken

    # -- lifetime ----------------------------------------------------------------------------------
    def _writer(self, what: str) -> Journal:
        if self.journal is None:
            raise SessionError(f"session {self.id} is open read-only; cannot {what}")
        if self.journal.closed:
            raise SessionError(f"session {self.id} is closed; cannot {what}")
        return self.journal

    def close(self) -> None:
        """Close the journal (releasing the writer lock); idempotent."""
        if self.journal is not None:
            self.journal.close()

    def __repr__(self) -> str:
        mode = "writer" if self.journal is not None else "reader"
        return f"<SessionFiles {self.id} {mode}>"


def _diff(old: str | None, new: str, parent: int | None, n: int) -> str:
    if old is None:
        return ""
    before = f"attempts/{parent:04d}/kernel.py" if parent is not None else "parent/kernel.py"
    return unified(old, new, before, f"attempts/{n:04d}/kernel.py")


class SessionStore:
    """The sessions folder: creates, opens and lists sessions."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        """The sessions folder; created by the first create()."""

    def create(self, *, task: str, agent: str, model: str | None, device: str, budget: dict) -> SessionFiles:
        """Make a new session folder and open its journal as the writer.

        The folder is built under a hidden temporary name and renamed into place, so list() never
        sees a half-made session.

        Raises:
            SessionError: the sessions folder cannot be written.
        """
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SessionError(f"{self.root}: cannot create the sessions folder: {exc.strerror}") from None
        for _ in range(100):
            session_id = _new_id(task)
            final = self.root / session_id
            if final.exists():
                continue
            meta = {
                "schema_version": SCHEMA_VERSION,
                "events_version": EVENTS_VERSION,
                "id": session_id,
                "task": task,
                "agent": agent,
                "model": model,
                "device": device,
                "created": utc_now_ms(),
                "status": "new",
                "budget": dict(budget),
                "checkpoint_seq": 0,
                "journal": Anchor(0, 0, "").to_dict(),
            }
            try:
                staged = self._stage(session_id, meta)
            except (OSError, ValueError) as exc:
                raise SessionError(f"{self.root}: cannot create session {session_id}: {exc}") from None
            try:
                # rename(2) refuses a non-empty target, so a concurrent create of the same id loses cleanly.
                os.rename(staged, final)
            except OSError as exc:
                shutil.rmtree(staged, ignore_errors=True)
                if final.exists():
                    continue
                raise SessionError(f"{final}: cannot create the session folder: {exc.strerror}") from None
            fsync_dir(self.root)
            journal = Journal.open(final / "events.jsonl")
            return SessionFiles(session_id, final, journal, drop_none(meta))
        raise SessionError(f"{self.root}: could not find a free session id")

    def _stage(self, session_id: str, meta: dict) -> Path:
        staged = Path(tempfile.mkdtemp(dir=self.root, prefix=f".{session_id}.", suffix=".creating"))
        try:
            os.chmod(staged, 0o755)
            (staged / "attempts").mkdir()
            (staged / "inbox").mkdir()
            write_toml_atomic(staged / "session.toml", meta)
            fd = os.open(staged / "events.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_dir(staged)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        return staged

    def open(self, session_id: str, *, writer: bool) -> SessionFiles:
        """Open a session by id (or by a prefix that names exactly one).

        A writer takes the journal lock, verifies the journal (only its tail, when session.toml holds
        a matching anchor) and writes a migrated session.toml back; a reader takes no lock and writes
        nothing, so it can sit beside a live writer.

        Raises:
            SessionError: unknown id (near matches named), ambiguous prefix, unreadable or newer
                session.toml.
            JournalError: as a writer, the journal is locked (JournalLocked), corrupt or missing.
        """
        folder = self.root / self.resolve(session_id)
        meta, migrated = _read_meta(folder)
        journal = None
        if writer:
            anchor = None
            try:
                anchor = Anchor.coerce(meta.get("journal"))
            except JournalError:
                pass
            journal = Journal.open(folder / "events.jsonl", verified_upto=anchor)
            if migrated:
                try:
                    write_toml_atomic(folder / "session.toml", meta)
                except BaseException:
                    journal.close()
                    raise
        return SessionFiles(folder.name, folder, journal, meta)

    def _ids(self) -> list[str]:
        try:
            return sorted(
                (p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")),
                reverse=True,
            )
        except FileNotFoundError:
            return []

    def resolve(self, session_id: str) -> str:
        """The folder name of session `session_id`: an exact id, or a prefix naming exactly one.

        Only folder names are read (not session.toml, whose checkpoint can be megabytes), so this is cheap.

        Raises:
            SessionError: not an id, unknown (near matches named), or an ambiguous prefix.
        """
        if not session_id or "/" in session_id or "\\" in session_id or session_id.startswith("."):
            raise SessionError(f"{session_id!r} is not a session id")
        ids = self._ids()
        if session_id in ids:
            return session_id
        prefixed = [i for i in ids if i.startswith(session_id)]
        if len(prefixed) == 1:
            return prefixed[0]
        if prefixed:
            shown = ", ".join(prefixed[:5]) + (", ..." if len(prefixed) > 5 else "")
            raise SessionError(f"session id {session_id!r} is ambiguous in {self.root}: {shown}")
        near = difflib.get_close_matches(session_id, ids, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(near)}?" if near else ("; no sessions there yet" if not ids else "")
        raise SessionError(f"no session {session_id!r} in {self.root}{hint}")

    def list(self) -> list[dict]:
        """The meta of every session, newest first; a broken folder is listed with an 'error' field.

        Where session.toml has a [summary] (every checkpoint writes one), only the part before [state] is parsed,
        and the entry has no "state": use workbench.session.summary.of(entry) for the list's fields.
        """
        sessions = []
        for session_id in self._ids():
            try:
                meta = _read_head(self.root / session_id)
            except SessionError as exc:
                sessions.append({"id": session_id, "error": str(exc)})
                continue
            if meta.get("id") != session_id:
                meta = {**meta, "error": f"session.toml names id {meta.get('id')!r}, not its folder {session_id!r}"}
            meta["id"] = session_id
            sessions.append(meta)
        return sessions
