"""StatusBar: one line with the run state, progress against the budget, the best result and the running time."""

from __future__ import annotations

from datetime import datetime, timezone

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Static

from workbench.session.state import SessionState, parse_ts
from workbench.ui import formatting as fmt
from workbench.ui.static_text import update_static

RUN_STATES = ("new", "created", "running", "pausing", "paused", "resuming", "stopping", "stopped", "finished")
"""What the state pill can say; each maps to one `-` class below."""

_STATE_CLASS = {
    "new": "-stopped",
    "created": "-stopped",
    "running": "-running",
    "pausing": "-paused",
    "paused": "-paused",
    "resuming": "-running",
    "stopping": "-stopping",
    "stopped": "-stopped",
    "finished": "-stopped",
}


def short_device(device: str) -> str:
    """'cuda:NVIDIA H200' as 'H200', 'cpu' as 'cpu': the status line has room for the chip, not the vendor."""
    return device.split(":")[-1].replace("NVIDIA ", "").strip() or device


class StatusBar(Horizontal):
    """The top line of the live screen, refreshed once per flush tick (never per event)."""

    DEFAULT_CSS = """
    StatusBar {
        height: 1;
        background: $panel;
        color: $foreground;
    }
    StatusBar > #run-state {
        width: auto;
        padding: 0 1;
        text-style: bold;
        background: $panel-lighten-2;
        color: $text-muted;
    }
    StatusBar.-running > #run-state { background: $success; color: $text; }
    StatusBar.-paused > #run-state { background: $warning; color: $text; }
    StatusBar.-stopping > #run-state { background: $error; color: $text; }
    StatusBar > Static { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    StatusBar > #summary { width: 1fr; padding: 0 1; }
    StatusBar > #clock { width: auto; padding: 0 1; }
    """

    run_state: reactive[str] = reactive("new")
    """The word in the state pill; drives the -running/-paused/-stopping/-stopped class."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._last: tuple[Content, Content] | None = None
        """(summary, clock) as drawn last, so an unchanged piece costs no refresh."""

    def compose(self) -> ComposeResult:
        yield Static("", id="run-state")
        yield Static("", id="summary")
        yield Static("", id="clock")

    def watch_run_state(self, run_state: str) -> None:
        # The in-between states wait on the runtime's next step boundary, which can take a while.
        waiting = run_state in ("pausing", "resuming", "stopping")
        update_static(self.query_one("#run-state", Static), run_state.upper() + ("…" if waiting else ""),
                      auto_width=True, one_line=True)
        active = _STATE_CLASS.get(run_state, "-stopped")
        for name in set(_STATE_CLASS.values()):
            self.set_class(name == active, name)

    def show(self, state: SessionState, *, run_state: str, mode: str, now: datetime | None) -> None:
        """Redraw from `state`.

        Args:
            state: the UI's folded session state.
            run_state: one of RUN_STATES (the state, or what a pending pause/stop makes it).
            mode: 'live' when this TUI drives the agent, 'attached' when it follows another process.
            now: the clock for the running interval; None for the real clock.
        """
        self.run_state = run_state
        summary = self._summary(state, mode)
        clock = Content.assemble(self._api_wait(state, now or datetime.now(timezone.utc)), self._clock(state, now))
        last_summary, last_clock = self._last or (None, None)
        self._last = (summary, clock)
        # Each piece only when it reads differently: the clock moves every second, the summary with each tool call.
        if summary != last_summary:
            update_static(self.query_one("#summary", Static), summary, one_line=True)
        if clock != last_clock:
            update_static(self.query_one("#clock", Static), clock, auto_width=True, one_line=True)

    @staticmethod
    def _summary(state: SessionState, mode: str) -> Content:
        budget = state.budget or {}
        sep = (" │ ", "$foreground-muted")
        parts: list[str | tuple[str, str]] = [(state.task or "no task", "bold")]
        agent = state.agent + (f" {state.model}" if state.model else "")
        if agent:
            parts += [(f" · {agent}", "$foreground-muted")]
        if mode == "attached":
            parts += [(" · attached, read-only", "$text-warning")]
        current = state.current
        parts += [sep, "attempt ", (str(current.n) if current else fmt.DASH, "bold")]
        if budget.get("max_iterations") is not None:
            parts += [(f" ({state.evaluated}/{budget['max_iterations']})", "$foreground-muted")]
        parts += [sep, "tools ", (str(state.tool_calls), "bold")]
        if budget.get("max_tool_calls") is not None:
            parts += [(f"/{budget['max_tool_calls']}", "$foreground-muted")]
        if state.in_flight:
            tools = ", ".join(sorted({call["tool"] for call in state.in_flight.values()}))
            parts += [(f" {tools}…", "$text-accent")]
        best = state.best_attempt
        parts += [sep, "best "]
        if best is None:
            parts += [(fmt.DASH, "$foreground-muted")]
        else:
            parts += [(fmt.speedup(best.speedup), "bold $text-success"), f" {fmt.ms(best.ms)} ms",
                      (f" #{best.n}", "$foreground-muted")]
        if state.errors:
            parts += [sep, (f"{len(state.errors)} error{'s' if len(state.errors) > 1 else ''}", "$text-error")]
        return Content.assemble(*parts)

    @staticmethod
    def _api_wait(state: SessionState, now: datetime) -> Content:
        """'waiting for the model API (retry 3 in 12 s)' while it is failing, counted down to the retry; else empty."""
        wait = state.api_wait
        if not wait:
            return Content("")
        due = parse_ts(wait["ts"]).timestamp() + float(wait["retry_in"])
        left = max(0, round(due - now.timestamp()))
        return Content.assemble((f"waiting for the model API (retry {wait['try']} in {left} s)", "bold $text-warning"),
                                (" │ ", "$foreground-muted"))

    @staticmethod
    def _clock(state: SessionState, now: datetime | None) -> Content:
        # The running interval is open while the agent works, so it is measured to the live clock.
        elapsed = state.elapsed_at(now or datetime.now(timezone.utc))
        parts: list[str | tuple[str, str]] = [(fmt.duration(elapsed), "bold")]
        hours = (state.budget or {}).get("max_hours")
        if hours is not None:
            parts.append((f" / {fmt.duration(hours * 3600)}", "$foreground-muted"))
        return Content.assemble(*parts)
