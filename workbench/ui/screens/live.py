"""LiveScreen: the running session at a glance; redrawn on a tick, never once per event: the log and the status
line every 0.15 s, the other panes in groups, one group a tick, each at most twice a second."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence, cast

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer

from workbench.ui.compositor import SparseCompositor
from workbench.ui.formatting import next_filter, now_from
from workbench.ui.screens.events import EventListScreen
from workbench.ui.screens.nudge import NudgeRequest, NudgeScreen
from workbench.ui.widgets.eval_table import EvalTable
from workbench.ui.widgets.event_log import EventLog
from workbench.ui.widgets.fleet_panel import FleetPanel
from workbench.ui.widgets.kernel_view import KernelView
from workbench.ui.widgets.memory_panel import MemoryPanel
from workbench.ui.widgets.metrics_bar import MetricsBar
from workbench.ui.widgets.profiler_table import ProfilerTable
from workbench.ui.view import SessionView
from workbench.ui.widgets.status_bar import StatusBar

FLUSH_INTERVAL = 0.15
"""Seconds between UI flushes: fast enough to feel live, slow enough that a burst of events is one redraw."""
PANES_INTERVAL = 0.5
"""Least seconds between two redraws of one group of PANE_GROUPS by the tick. A redraw of all of them is a frame of
10-25 ms on a 2-core box that evaluates on both cores (the kernel's highlighting, the tables' cells); at the tuner's
pace of several attempts a second, redrawing them on every tick kept the main thread busy enough that a key often
waited for such a frame. Twice a second still follows every evaluation."""
PANE_GROUPS = ("kernel", "evaluation", "side")
"""The panes other than the log and the status line, in the groups the tick redraws in turn, one a tick: the kernel
pane, the evaluation table, and the rest of the side column with the metrics line (fleet, profile, memory)."""


def _screen_key(key: str, action: str, description: str, binding_id: str, tooltip: str) -> Binding:
    """One of the screen's keys, with priority: Textual finds it on its first pass over the bindings instead of
    offering the key to the focused widget and its ancestors first. Nothing on this screen takes typed text (the
    kernel pane is read-only)."""
    return Binding(key, action, description, id=binding_id, priority=True, tooltip=tooltip)


class LiveScreen(Screen[None]):
    """Kernel, latest evaluation and profile, goal and memory, event log, status and metrics lines for one session."""

    CSS_PATH = "live.tcss"

    BINDINGS = [
        _screen_key("n", "nudge", "Nudge", "nudge", "Send the agent a hint; it reads it at the next step boundary"),
        _screen_key("p", "toggle_pause", "Pause/Resume", "pause",
                    "Pause the agent at the next step boundary, or resume it"),
        _screen_key("r", "profile", "Profile", "profile",
                    "Ask the agent to profile the current attempt at the next step boundary"),
        _screen_key("d", "cycle_kernel_view", "Diff", "kernel.diff",
                    "Kernel pane: source, diff against the parent, diff against the best"),
        _screen_key("f", "cycle_filter", "Filter", "events.filter",
                    "Event log: all, attempts and evaluations, tools, nudges and errors"),
        _screen_key("l", "list_events", "Events", "events.list", "List the recent events and open any of them whole"),
    ]

    @dataclass
    class NudgeSent(Message):
        """The person wrote a nudge for the agent."""

        text: str
        persistent: bool

    class PauseToggled(Message):
        """Pause the agent, or resume it when paused."""

    class ProfileRequested(Message):
        """Profile the current attempt at the next step boundary."""

    @property
    def workbench(self) -> SessionView:
        """What this screen reads of the app."""
        return cast(SessionView, self.app)

    def compose(self) -> ComposeResult:
        settings = self.workbench.settings
        yield StatusBar(id="status")
        yield MetricsBar(id="metrics")
        with Horizontal(id="main"):
            yield KernelView(cursor_blink=settings.cursor_blink, id="kernel")
            with Vertical(id="side"):
                yield EvalTable(id="eval")
                yield FleetPanel(id="fleet")
                yield ProfilerTable(id="profiler")
                yield MemoryPanel(id="memory")
        yield EventLog(max_lines=settings.log_max_lines, id="events")
        yield Footer()

    def __init__(self) -> None:
        super().__init__()
        self._compositor = SparseCompositor()
        self._fleet_seen = 0
        """The app's fleet_seen when the fleet pane was last drawn."""
        self._stale: set[str] = set()
        """The groups of PANE_GROUPS that events (or a fleet change) reached and that have not been redrawn since."""
        self._drawn_at = dict.fromkeys(PANE_GROUPS, 0.0)
        """When the tick last redrew each group (time.monotonic)."""
        self._last_group = PANE_GROUPS[-1]
        """The group the tick drew last: the next tick looks at the ones after it first."""

    def on_mount(self) -> None:
        self.refresh_panes()
        self.refresh_status()
        self.set_interval(FLUSH_INTERVAL, self.tick)

    def tick(self) -> None:
        """The timer's flush: the log and the status line each time, and at most one group of the other panes, the
        next stale one (in turn) whose last draw is PANES_INTERVAL old.

        One group a tick, so the main thread, which also takes the keys, never spends one tick and one frame on every
        pane at once: that was 20-30 ms of CPU a time at the tuner's pace, which a key pressed meanwhile waited for.
        """
        now = time.monotonic()
        start = PANE_GROUPS.index(self._last_group) + 1
        for group in PANE_GROUPS[start:] + PANE_GROUPS[:start]:
            if group in self._stale and now - self._drawn_at[group] >= PANES_INTERVAL:
                self.flush(panes=(group,))
                self._drawn_at[group], self._last_group = now, group
                return
        self.flush(panes=())

    def flush(self, *, panes: Sequence[str] = PANE_GROUPS) -> None:
        """Write every event that arrived since the last flush in one batch, then redraw the stale groups of `panes`
        (PANE_GROUPS; all of them unless told) and the status line."""
        with self.app.batch_update():
            self.drain_log()
            if self.workbench.fleet_seen != self._fleet_seen:
                self._stale.add("side")
            for group in panes:
                if group in self._stale:
                    self._stale.discard(group)
                    self._draw(group)
            self.refresh_status(metrics="side" in panes)

    def drain_log(self) -> None:
        """Write the events received since the last look to the log only; the other panes follow on the tick.

        A key that redraws the log calls this instead of flush(), so its frame repaints the log and nothing else.
        """
        events = self._take_pending()
        if events:
            self.query_one(EventLog).write_events(events)

    def _take_pending(self) -> list[dict[str, Any]]:
        """The events received since the last look; every pane group is stale once there are any."""
        events = self.workbench.take_pending()
        if events:
            self._stale.update(PANE_GROUPS)
        return events

    def refresh_panes(self) -> None:
        """Bring every pane but the log and the status line up to the app's state; each skips work if unchanged."""
        for group in PANE_GROUPS:
            self._stale.discard(group)
            self._draw(group)

    def _draw(self, group: str) -> None:
        """Bring one group of PANE_GROUPS up to the app's state."""
        app = self.workbench
        state = app.state
        if group == "kernel":
            current = state.current
            self.query_one(KernelView).show(current, best=state.best, attempts=state.attempts,
                                            evaluating=current is not None
                                            and any(job.get("attempt") == current.n for job in state.jobs.values()))
        elif group == "evaluation":
            self.query_one(EvalTable).show(state)
        else:
            self.query_one(FleetPanel).show(state, app.fleet)
            self._fleet_seen = app.fleet_seen
            self.query_one(ProfilerTable).show(app.current_profile(), app.best_profile())
            self.query_one(MemoryPanel).show(state)

    def refresh_status(self, *, metrics: bool = True) -> None:
        """Redraw the status line (once per tick: the clock moves even when no event arrives), and the metrics line
        with it unless `metrics` is False (the tick draws that with the side group of PANE_GROUPS)."""
        app = self.workbench
        self.query_one(StatusBar).show(
            app.state, run_state=app.run_state, mode=app.mode, now=now_from(app.settings.frozen_clock)
        )
        if metrics:
            self.query_one(MetricsBar).show(app.state)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Grey out commands this TUI cannot deliver (attach mode without inbox, a run that has ended)."""
        app = self.workbench
        if action == "nudge":
            return True if app.can_nudge else None
        if action in ("toggle_pause", "profile"):
            return True if app.can_command else None
        return True

    def action_nudge(self) -> None:
        app = self.workbench
        note = "This TUI is attached: the nudge goes to the session inbox." if app.mode == "attached" else ""
        self.app.push_screen(NudgeScreen(read_only_note=note, cursor_blink=app.settings.cursor_blink),
                             self._nudge_written)

    def _nudge_written(self, request: NudgeRequest | None) -> None:
        if request is not None:
            self.post_message(self.NudgeSent(request.text, request.persistent))

    def action_toggle_pause(self) -> None:
        self.post_message(self.PauseToggled())

    def action_profile(self) -> None:
        self.post_message(self.ProfileRequested())

    def action_cycle_kernel_view(self) -> None:
        self.query_one(KernelView).cycle_view()

    def action_cycle_filter(self) -> None:
        # Events still waiting for the tick go in with the switch (one rewrite), so it shows everything received.
        log = self.query_one(EventLog)
        log.set_filter(next_filter(log.filter), self._take_pending())

    def action_list_events(self) -> None:
        self.drain_log()
        log = self.query_one(EventLog)
        self.app.push_screen(EventListScreen(list(self.workbench.recent), title="recent events",
                                             filter_key=log.filter))
