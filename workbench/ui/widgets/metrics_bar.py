"""MetricsBar: speedup over attempts as a sparkline, the latest result, model tokens and cost, device and session."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.content import Content
from textual.widgets import Sparkline, Static

from workbench.session.state import SessionState
from workbench.ui import formatting as fmt
from workbench.ui.static_text import update_static
from workbench.ui.widgets.status_bar import short_device


def speedup_series(state: SessionState) -> list[float]:
    """One value per evaluated attempt, in order: its speedup, or 0 when it was not correct (a visible dip)."""
    return [(a.speedup or 0.0) if a.verdict == "ok" else 0.0
            for _n, a in sorted(state.attempts.items()) if a.verdict is not None]


class MetricsBar(Horizontal):
    """The second line of the live screen; like the status bar it is redrawn once per flush tick, not per event."""

    DEFAULT_CSS = """
    MetricsBar {
        height: 1;
        background: $panel;
        color: $foreground;
    }
    MetricsBar > Static { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    MetricsBar > .label { width: auto; padding: 0 0 0 1; color: $text-muted; }
    MetricsBar > Sparkline { width: 20; margin: 0 1; }
    MetricsBar > Sparkline > .sparkline--max-color { color: $success; }
    MetricsBar > Sparkline > .sparkline--min-color { color: $error; }
    MetricsBar > #latest { width: auto; }
    MetricsBar > #spend { width: 1fr; }
    MetricsBar > #session { width: auto; padding: 0 1; color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._last: tuple[object, ...] | None = None
        """What was drawn last, so an unchanged tick costs nothing."""

    def compose(self) -> ComposeResult:
        yield Static("speedup", classes="label")
        yield Sparkline([], id="trend")
        yield Static("", id="latest")
        yield Static("", id="spend")
        yield Static("", id="session")

    def show(self, state: SessionState) -> None:
        """Redraw from `state` when anything shown has changed."""
        series = speedup_series(state)
        key = (tuple(series), state.best, state.tokens_in, state.tokens_out, round(state.cost_usd, 4), state.id)
        if key == self._last:
            return
        self._last = key
        self.query_one(Sparkline).data = series
        update_static(self.query_one("#latest", Static), self._latest(state, len(series)), auto_width=True,
                      one_line=True)
        sep = (" │ ", "$foreground-muted")
        if state.tokens_in or state.tokens_out or state.cost_usd:
            spend = Content.assemble(
                sep, ("tokens ", "$foreground-muted"), (fmt.tokens(state.tokens_in), "bold"),
                (" in · ", "$foreground-muted"), (fmt.tokens(state.tokens_out), "bold"), (" out · ", "$foreground-muted"),
                (f"${state.cost_usd:.2f}", "bold"),
            )
        else:
            # The offline tuner calls no model: say so rather than show a row of zeros.
            spend = Content.assemble(sep, ("no model tokens · $0.00", "$foreground-muted"))
        update_static(self.query_one("#spend", Static), spend, one_line=True)
        where = f"{short_device(state.device)} · " if state.device else ""
        update_static(self.query_one("#session", Static), Content(where + (state.id or "no session yet")),
                      auto_width=True, one_line=True)

    @staticmethod
    def _latest(state: SessionState, evaluated: int) -> Content:
        """The latest evaluation; how many there were is in the status line's attempt count."""
        if not evaluated:
            return Content.assemble(("no attempt evaluated yet", "$foreground-muted"))
        latest = max((a for a in state.attempts.values() if a.eval_seq is not None), key=lambda a: a.eval_seq or 0)
        style = "$text-success" if latest.verdict == "ok" else "$text-error"
        value = fmt.speedup(latest.speedup) if latest.verdict == "ok" else latest.verdict or "?"
        return Content.assemble(("last ", "$foreground-muted"), f"#{latest.n} ", (value, f"bold {style}"))
