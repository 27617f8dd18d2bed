"""SessionsScreen: every session under the sessions folder; Enter opens one for review."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from workbench.session import summary
from workbench.session.state import parse_ts
from workbench.ui import formatting as fmt
from workbench.ui.palette import MUTED, theme_style
from workbench.ui.view import SessionView

COLUMNS = (("id", "session", 34), ("task", "task", 12), ("agent", "agent", 8), ("status", "status", 9),
           ("attempts", "attempts", 8), ("best", "best", 8), ("duration", "running", 8), ("created", "created", 16))
"""(key, label, width): fixed widths, so a long list needs no measuring pass over every cell."""


def session_row(meta: Mapping[str, Any]) -> dict[str, str]:
    """One SessionStore.list() entry as the cells of the list (a broken folder keeps its id and says why)."""
    if meta.get("error"):
        # The store's message starts with the file's path, which the row already names.
        problem = str(meta["error"]).split("session.toml: ", 1)[-1]
        return {"id": str(meta.get("id", "?")), "task": "", "agent": "", "status": "broken", "attempts": "",
                "best": "", "duration": "", "created": fmt.shorten(problem, 60)}
    info = summary.of(meta)
    speed = info.get("best_speedup")
    return {
        "id": str(meta.get("id", "?")),
        "task": str(info.get("task") or ""),
        "agent": str(info.get("agent") or ""),
        "status": str(info.get("status") or ""),
        "attempts": str(info.get("attempts", 0)),
        "best": fmt.speedup(speed) if isinstance(speed, (int, float)) else fmt.DASH,
        "duration": fmt.duration(_elapsed(info)),
        "created": str(info.get("created") or "")[:16].replace("T", " "),
    }


def _elapsed(state: Mapping[str, Any]) -> float:
    """Running seconds as of the checkpoint; an interval still open (a killed run) counts up to its last event."""
    elapsed = float(state.get("elapsed_s") or 0.0)
    started, last = state.get("run_started_ts"), state.get("last_ts")
    if started and last:
        try:
            elapsed += max(0.0, (parse_ts(last) - parse_ts(started)).total_seconds())
        except ValueError:
            pass
    return elapsed


class SessionsScreen(Screen[None]):
    """The first screen of review mode; loads the list in a thread worker the first time it is shown."""

    CSS_PATH = "review.tcss"

    BINDINGS = [
        Binding("enter", "open", "Open", id="review.open", tooltip="Review the selected session", show=True),
        Binding("g", "reload", "Reload", id="review.reload", tooltip="Read the sessions folder again"),
    ]

    @dataclass
    class Loaded(Message):
        """The thread worker has read every session's meta."""

        rows: list[dict[str, str]]
        """One row per session, newest first."""
        error: str = ""
        """Why the folder could not be read ('' when it could)."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded = False
        """Whether the list has been read (it is read on first show, so `review ID` starts with that session)."""
        self.rows: list[dict[str, str]] = []
        """The rows on show."""

    @property
    def workbench(self) -> SessionView:
        """What this screen reads of the app."""
        return cast(SessionView, self.app)

    def compose(self) -> ComposeResult:
        yield Static("", id="sessions-header")
        table: DataTable[Text] = DataTable(id="sessions", cursor_type="row", zebra_stripes=True)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        yield table
        yield Footer()

    def on_mount(self) -> None:
        app = self.workbench
        launch = app.launch
        self.query_one("#sessions-header", Static).update(f" sessions in {launch.review_root}")
        if launch.review_id:
            from workbench.ui.screens.review import ReviewScreen

            assert launch.review_root is not None
            # The list waits until the person comes back to it: read now, its checkpoints (megabytes of TOML for
            # a long session) would compete with the session being opened for the one interpreter lock.
            self.app.push_screen(ReviewScreen(launch.review_root, launch.review_id,
                                              cursor_blink=app.settings.cursor_blink))
        else:
            self._load_once()

    def on_screen_resume(self) -> None:
        # The first resume can arrive before the mount; on_mount decides about that one.
        if self.is_mounted and self.is_active:
            self._load_once()

    def _load_once(self) -> None:
        if not self.loaded:
            self.loaded = True
            self.load()

    def action_reload(self) -> None:
        self.load()

    @work(thread=True, exclusive=True, exit_on_error=False, group="sessions", description="session list")
    def load(self) -> None:
        """Read every session.toml (a checkpoint can be megabytes, hence the thread)."""
        from workbench.session import SessionStore

        root = self.workbench.launch.review_root
        assert root is not None
        try:
            rows = [session_row(meta) for meta in SessionStore(Path(root)).list()]
        except OSError as exc:
            self.post_message(self.Loaded([], f"{root}: {exc.strerror or exc}"))
            return
        self.post_message(self.Loaded(rows))

    def on_sessions_screen_loaded(self, message: Loaded) -> None:
        header = self.query_one("#sessions-header", Static)
        root = self.workbench.launch.review_root
        if message.error:
            header.update(f" {message.error}")
            return
        self.rows = message.rows
        count = f"{len(self.rows)} session{'s' if len(self.rows) != 1 else ''}" if self.rows else "no sessions yet"
        header.update(f" {count} in {root} · Enter reviews one")
        table: DataTable[Text] = self.query_one(DataTable)
        table.clear()
        variables = self.app.theme_variables
        for row in self.rows:
            status = row["status"]
            style = theme_style(variables, "text-error" if status == "broken" else
                                "text-success" if status in ("running", "finished") else "foreground")
            table.add_row(*(Text(row[key], style=style if key == "status" else
                                 (MUTED if key in ("created", "duration") else ""),
                                 justify="right" if key in ("attempts", "best", "duration") else "left")
                            for key, _label, _width in COLUMNS), key=row["id"])
        table.focus()

    @on(DataTable.RowSelected, "#sessions")
    def _selected(self, event: DataTable.RowSelected) -> None:
        self._open(str(event.row_key.value))

    def action_open(self) -> None:
        table: DataTable[Text] = self.query_one(DataTable)
        if table.row_count:
            self._open(self.rows[table.cursor_row]["id"])

    def _open(self, session_id: str) -> None:
        from workbench.ui.screens.review import ReviewScreen

        root = self.workbench.launch.review_root
        assert root is not None
        row = next((r for r in self.rows if r["id"] == session_id), None)
        if row is not None and row["status"] == "broken":
            self.notify(f"{session_id}: {row['created']}", severity="error")
            return
        self.app.push_screen(ReviewScreen(Path(root), session_id, cursor_blink=self.workbench.settings.cursor_blink))
