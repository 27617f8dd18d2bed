"""WorkbenchApp: owns the UI's SessionState, the agent worker and the command queue; screens only read and ask."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from pathlib import Path
from typing import Any, Iterable

from textual import on, work
from textual.app import App
from textual.binding import Binding
from textual.worker import Worker, WorkerState, get_current_worker

from workbench.agent.commands import Command
from workbench.config import Settings
from workbench.session.state import SessionState, apply
from workbench.ui.bridge import UiBridge
from workbench.ui.collector import FrozenSurvivors
from workbench.ui.launch import Launch
from workbench.agent.sink import FleetView
from workbench.ui.messages import FleetChanged, JournalEvent, Notice, Question, RunFinished, StopRequested
from workbench.ui.screens.error import ErrorScreen
from workbench.ui.screens.help import HelpScreen
from workbench.ui.screens.live import LiveScreen
from workbench.ui.screens.question import QuestionScreen
from workbench.ui.screens.sessions import SessionsScreen
from workbench.ui.themes import ThemeSet, choose_theme, load_themes

_SEVERITIES = ("information", "warning", "error")


class WorkbenchApp(App[str]):
    """The workbench TUI. Build it with workbench.ui.factory.make_app, never directly.

    Two MODES share the widgets: 'live' (one session, run here or followed) and 'review' (the sessions folder,
    read-only: the session list, then one session's timeline, diffs, plots and ledger at any step).

    Threading contract: the agent and the journal follower run in thread workers that only post messages
    (JournalEvent, FleetChanged, RunFinished, Notice, Question). Handlers here, on the UI thread, own `state` and `pending`;
    the live screen drains `pending` on its flush tick.
    """

    CSS_PATH = "app.tcss"
    MODES = {"live": LiveScreen, "review": SessionsScreen}
    DEFAULT_MODE = "live"
    TITLE = "Kernel Workbench"

    BINDINGS = [
        Binding("q", "quit", "Quit", id="quit",
                tooltip="Stop the agent at the next step boundary, then exit (q again: exit now)"),
        Binding("f1,question_mark", "help", "Help", id="help", key_display="F1/?",
                tooltip="List every key on this screen and its binding id"),
    ]

    def __init__(
        self,
        settings: Settings,
        state: SessionState,
        themes: ThemeSet,
        launch: Launch,
        *,
        theme_dirs: Iterable[Path] = (),
    ) -> None:
        # App.__init__ creates the first screen stack from DEFAULT_MODE, so the starting mode is set before it.
        self.DEFAULT_MODE = "review" if launch.mode == "review" else "live"  # type: ignore[misc]
        super().__init__()
        self.settings = settings
        """User preferences (theme, keymap, watchers, log size, clock)."""
        self.state = state
        """The UI's own SessionState, advanced by applying every JournalEvent; never shared with the runtime."""
        self.launch = launch
        """What this TUI does: drive a run, follow a journal, review sessions, or show one."""
        self.theme_dirs = [d for d in theme_dirs if d is not None]
        """Directories the themes came from; watched when settings.watch_themes is on."""
        self.commands: queue.Queue[Command] = queue.Queue()
        """Nudges, pause and resume for the runtime, which drains them at step boundaries."""
        self.pending: deque[dict[str, Any]] = deque(maxlen=max(1, settings.log_max_lines))
        """Events applied to `state` but not yet written to the log pane (bounded like the pane itself)."""
        self.recent: deque[dict[str, Any]] = deque(maxlen=max(1, settings.log_max_lines))
        """The newest events, filtered or not: what a new log filter and the event list are drawn from."""
        self.profiles: dict[int, dict[str, Any]] = {}
        """profile.finished data by attempt, merged (an evaluation's kernel tables, then an Nsight Compute run), so
        the profile pane shows both and can compare with the best attempt's profile."""
        self.profiled: int | None = None
        """The attempt profiled last: the one the profile pane shows."""
        if isinstance(state.profile.get("attempt"), int):
            self.profiled = state.profile["attempt"]
            self.profiles[self.profiled] = state.profile
        self.fleet: FleetView | None = None
        """The runtime's latest view of its evaluation slots (phases, queue); None until one arrives."""
        self.fleet_seen = 0
        """Fleet views received so far (the live screen's flush redraws the fleet pane when this moves)."""
        self.stopping = False
        """q was pressed and the agent has been told to stop; the app exits when its thread returns."""
        self.run_over = launch.runtime is None and launch.follow_path is None
        """The agent thread (or follower) has returned; nothing more will arrive."""
        self.finish_reason: str | None = None
        """The runtime's stop reason once run_over."""
        self.pause_target: bool | None = None
        """A pause (True) or resume (False) sent but not yet journaled; None when nothing is pending."""
        self._agent_worker: Worker[str] | None = None
        self._agent_started = threading.Event()
        """Set by the worker thread: a cancelled worker whose thread never ran will never post RunFinished."""
        self._agent_done = threading.Event()
        """Set as the worker thread returns: run.stopped is on disk."""
        self._startup_notes = list(themes.problems)
        self._collector = FrozenSurvivors()
        """Keeps full garbage collections short while the app runs (workbench.ui.collector)."""
        for theme in themes.themes.values():
            self.register_theme(theme)
        truecolor = self.console.color_system == "truecolor"
        name, note = choose_theme(settings.theme, self.available_themes, truecolor=truecolor)
        if note:
            self._startup_notes.append(note)
        self.theme = name

    # -- modes and derived state -----------------------------------------------------------------
    @property
    def mode(self) -> str:
        """'live' (this TUI runs the agent), 'attached' (it follows a journal), 'review' or 'view' (neither)."""
        return self.launch.mode

    @property
    def can_command(self) -> bool:
        """Pause, resume and profile reach only an agent this TUI runs, while it runs."""
        return self.launch.runtime is not None and not self.run_over and not self.stopping

    @property
    def can_nudge(self) -> bool:
        """Nudges reach a running agent through the queue, or a followed one through its inbox."""
        if self.mode == "attached":
            return self.launch.inbox is not None and not self.run_over
        return self.can_command

    @property
    def run_state(self) -> str:
        """What the status pill says: the journaled state, or the stop/pause this TUI is waiting for."""
        if self.stopping and not self.run_over:
            return "stopping"
        if self.pause_target is True and self.state.status == "running":
            return "pausing"
        if self.pause_target is False and self.state.status == "paused":
            return "resuming"
        return self.state.status

    def current_profile(self) -> dict[str, Any] | None:
        """Everything profiled for the attempt profiled last, or None before any profile."""
        return self.profiles.get(self.profiled) if self.profiled is not None else None

    def best_profile(self) -> dict[str, Any] | None:
        """The best attempt's profile, when it is not the one on show (nothing to compare with then)."""
        best = self.state.best
        return self.profiles.get(best) if best is not None and best != self.profiled else None

    def take_pending(self) -> list[dict[str, Any]]:
        """Hand the events received since the last flush to the live screen."""
        events = list(self.pending)
        self.pending.clear()
        return events

    # -- lifecycle -------------------------------------------------------------------------------
    def run(self, **kwargs: Any) -> str | None:
        """App.run with the mouse setting applied (`workbench --no-mouse` keeps the terminal's selection).

        While it runs an agent, SIGTERM and SIGHUP stop the run as they do a headless one (Textual handles neither:
        by default each ends the process at once, with no run.stopped and the evaluation's processes left running).
        It returns once the agent's thread has: the caller closes the session's journal next.
        """
        kwargs.setdefault("mouse", self.settings.mouse)
        if self.launch.runtime is None or threading.current_thread() is not threading.main_thread():
            return super().run(**kwargs)
        from workbench.agent.signals import StopSignals

        signals = StopSignals(self.stop_for_signal).install()
        try:
            return super().run(**kwargs)
        finally:
            if self._agent_started.is_set():
                self._agent_done.wait()  # stopped already: Textual cancelled the worker as the app exited
            signals.restore()

    def stop_for_signal(self, signum: int) -> None:
        """From the signal watcher thread: stop the runtime now (it aborts an evaluation), then tell the app."""
        import signal

        from workbench.agent.signals import stop_reason

        runtime = self.launch.runtime
        assert runtime is not None
        reason = stop_reason(signum)
        runtime.request_stop(reason)
        self.post_message(StopRequested(reason, hung_up=signum == signal.SIGHUP))

    def on_mount(self) -> None:
        self._collector.install()
        self.set_keymap(self.settings.keymap)
        unknown = sorted(set(self.settings.keymap) - known_binding_ids())
        if unknown:
            self._startup_notes.append(f"keymap: unknown binding id {', '.join(map(repr, unknown))}")
        for note in self._startup_notes:
            self.notify(note, severity="warning", timeout=8)
        if self.launch.runtime is not None:
            self._agent_worker = self.run_agent()
        elif self.launch.follow_path is not None:
            self.follow_journal(self.launch.follow_path, self.state.last_seq + 1)
        if self.settings.watch_themes and self.theme_dirs:
            self.watch_theme_files()

    def on_unmount(self) -> None:
        self._collector.uninstall()

    @work(thread=True, exclusive=True, exit_on_error=False, group="agent", description="agent run")
    def run_agent(self) -> str:
        """Run the agent until it finishes or the worker is cancelled (which sets `stop`)."""
        self._agent_started.set()
        stop = get_current_worker().cancelled_event
        runtime = self.launch.runtime
        assert runtime is not None
        reason, error = "error", ""
        try:
            reason = runtime.run(stop=stop, commands=self.commands, sink=UiBridge(self.post_message))
            return reason
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            # After a cancel the worker already reads CANCELLED; this message is how the app learns the
            # thread itself has returned, i.e. that run.stopped is on disk.
            self._agent_done.set()
            self.post_message(RunFinished(reason, error))

    @work(thread=True, exclusive=True, exit_on_error=False, group="follow", description="journal follower")
    def follow_journal(self, path: Path, start_seq: int) -> None:
        """Post every event appended to `path` from `start_seq` on, until the worker is cancelled."""
        from workbench.journal import follow

        stop = get_current_worker().cancelled_event
        try:
            for event in follow(path, start_seq=start_seq, stop=stop):
                self.post_message(JournalEvent(event))
        finally:
            self.post_message(RunFinished("detached"))

    @work(exclusive=True, exit_on_error=False, group="themes", description="theme watcher")
    async def watch_theme_files(self) -> None:
        """Reload themes when a *.toml in a theme directory changes (settings.watch_themes)."""
        from watchfiles import awatch

        directories = [d for d in self.theme_dirs if d.is_dir()]
        if not directories:
            return
        async for _changes in awatch(*directories, debounce=250, watch_filter=lambda _c, p: p.endswith(".toml")):
            self.apply_reloaded_themes(await asyncio.to_thread(load_themes, directories))

    def apply_reloaded_themes(self, found: ThemeSet) -> None:
        """Register re-read themes; if the one in use changed, restyle everything with it."""
        for problem in found.problems:
            self.notify(problem, severity="warning", timeout=8)
        for theme in found.themes.values():
            self.register_theme(theme)
        if self.theme in found.themes:
            self.refresh_css(animate=False)
            self.theme_changed_signal.publish(self.current_theme)
            self.notify(f"theme {self.theme!r} reloaded", timeout=3)

    # -- messages from the workers ---------------------------------------------------------------
    def on_journal_event(self, message: JournalEvent) -> None:
        record = message.event.to_dict()
        if record["seq"] <= self.state.last_seq:
            return  # already folded into the starting state (a follower may overlap it)
        apply(self.state, record)
        self.pending.append(record)
        self.recent.append(record)
        if record["type"] == "profile.finished" and isinstance(record["data"].get("attempt"), int):
            self.profiled = record["data"]["attempt"]
            self.profiles[self.profiled] = {**self.profiles.get(self.profiled, {}), **record["data"]}
        if record["type"] in ("run.paused", "run.resumed"):
            self.pause_target = None
            self.refresh_bindings()

    def on_fleet_changed(self, message: FleetChanged) -> None:
        self.fleet = message.view
        self.fleet_seen += 1

    def on_run_finished(self, message: RunFinished) -> None:
        self.run_over = True
        self.finish_reason = message.reason
        self.refresh_bindings()
        if self.stopping:
            self.exit(result=message.reason, return_code=1 if message.error else 0, message=message.error or None)
        elif not message.error and self.mode == "live":
            self.notify(f"Run ended: {message.reason}. Press q to quit.", timeout=10)

    def on_stop_requested(self, message: StopRequested) -> None:
        """A signal stops the run: show it, exit once the runtime has journaled run.stopped."""
        if message.hung_up or self.run_over or not self._agent_started.is_set():
            self.exit(result=message.reason)
            return
        self.stopping = True
        if self._agent_worker is not None:
            self._agent_worker.cancel()
        self.refresh_bindings()
        self.notify(f"{message.reason}: stopping (an evaluation in progress is aborted)…", title="stopping",
                    severity="warning", timeout=30)

    def on_notice(self, message: Notice) -> None:
        severity = message.severity if message.severity in _SEVERITIES else "information"
        self.notify(message.text, severity=severity)  # type: ignore[arg-type]

    def on_question(self, message: Question) -> None:
        future = message.future

        def answered(answer: str | None) -> None:
            if future.done():
                return  # the runtime stopped waiting (stop, or its own timeout)
            if answer is None:
                future.cancel()
            else:
                future.set_result(answer)

        self.push_screen(QuestionScreen(message.text, cursor_blink=self.settings.cursor_blink), answered)

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        """The one place a worker error is handled: a modal, not a crash; the journal already holds the session."""
        if event.state != WorkerState.ERROR:
            return
        error = event.worker.error
        text = f"{type(error).__name__}: {error}" if error is not None else "unknown error"
        if event.worker.group == "agent":
            hint = (f"The session is saved on disk up to event {self.state.last_seq}. "
                    f"`workbench resume {self.state.id or 'ID'}` continues it. Press q to quit.")
        elif event.worker.group == "follow":
            hint = "The journal can no longer be followed; the agent writing it is not affected."
        else:
            hint = "The run is not affected."
        self.push_screen(ErrorScreen(f"{event.worker.description} failed", text, hint))

    # -- actions and commands --------------------------------------------------------------------
    async def action_quit(self) -> None:
        """Stop cleanly: cancel the agent worker (its `stop` event), show 'stopping', exit when it returns."""
        worker = self._agent_worker
        if worker is not None and not self.run_over and self._agent_started.is_set():
            if not self.stopping:
                self.stopping = True
                worker.cancel()
                self.refresh_bindings()
                self.notify("Stopping at the next step boundary… press q again to quit without waiting.",
                            title="stopping", timeout=30)
                return
            # Second q: leave now, aborting an evaluation in progress; run() waits for run.stopped to be journaled.
            runtime = self.launch.runtime
            assert runtime is not None
            runtime.request_stop("stopped by the person")
        self.workers.cancel_all()
        self.exit(result=self.finish_reason or ("detached" if self.mode == "attached" else "closed"))

    def action_help(self) -> None:
        rows = []
        seen: set[str] = set()
        for key, active in self.screen.active_bindings.items():
            binding = active.binding
            if binding.id in seen or binding.id is None:
                continue
            seen.add(binding.id)
            keys = [k for k, a in self.screen.active_bindings.items() if a.binding.id == binding.id]
            rows.append((", ".join(self.get_key_display(Binding(k, "")) for k in keys), binding.description,
                         binding.id, binding.tooltip))
        self.push_screen(HelpScreen(rows))

    def on_live_screen_nudge_sent(self, message: LiveScreen.NudgeSent) -> None:
        self.send_nudge(message.text, message.persistent)

    def on_live_screen_pause_toggled(self, message: LiveScreen.PauseToggled) -> None:
        self.toggle_pause()
        if isinstance(self.screen, LiveScreen):
            self.screen.refresh_status()

    def on_live_screen_profile_requested(self, message: LiveScreen.ProfileRequested) -> None:
        self.request_profile()

    def send_nudge(self, text: str, persistent: bool) -> None:
        """Queue a nudge for the runtime, or drop it in the followed session's inbox."""
        inbox = self.launch.inbox
        if self.mode == "attached" and inbox is not None:
            self.run_worker(lambda: inbox(text, persistent), thread=True, group="inbox",
                            description="nudge to inbox", exit_on_error=False)
            self.notify("Nudge written to the session inbox.")
        elif self.can_command:
            self.commands.put(Command("nudge", text, persistent))
            self.notify("Nudge queued: the agent reads it at the next step boundary.")

    def toggle_pause(self) -> None:
        """Pause a running agent or resume a paused one; the status shows 'pausing' until it is journaled."""
        if not self.can_command:
            return
        paused = self.pause_target if self.pause_target is not None else self.state.status == "paused"
        self.commands.put(Command("resume" if paused else "pause"))
        self.pause_target = not paused

    def request_profile(self) -> None:
        """Ask the runtime to profile the current attempt at the next step boundary."""
        if self.can_command:
            self.commands.put(Command("profile"))
            self.notify("Profile requested for the next step boundary.")


def known_binding_ids() -> set[str]:
    """Every binding id a [keymap] table may name: the app's, its screens' and Textual's own."""
    from textual.screen import Screen

    from workbench.ui.screens.events import EventDetailScreen, EventListScreen
    from workbench.ui.screens.nudge import NudgeScreen
    from workbench.ui.screens.review import ReviewScreen

    ids: set[str] = set()
    for owner in (App, Screen, WorkbenchApp, LiveScreen, NudgeScreen, QuestionScreen, HelpScreen, ErrorScreen,
                  EventListScreen, EventDetailScreen, SessionsScreen, ReviewScreen):
        for binding in owner.BINDINGS:
            if isinstance(binding, Binding) and binding.id:
                ids.add(binding.id)
    return ids
