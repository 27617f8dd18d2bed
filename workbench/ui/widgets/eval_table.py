"""EvalTable: the latest evaluation, one row per shape, changed by key so the table is never rebuilt."""

from __future__ import annotations

import re
from typing import Any, Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import Static

from workbench.session.state import Attempt, SessionState
from workbench.ui import formatting as fmt
from workbench.ui.palette import MUTED, theme_style, verdict_variable
from workbench.ui.static_text import update_static
from workbench.ui.widgets.keyed_table import Column, KeyedTable
from workbench.ui.widgets.pane import Pane

COLUMNS = (
    ("shape", "shape"),
    ("correct", "ok"),
    ("rel_err", "rel err"),
    ("ms", "ms"),
    ("baseline_ms", "base"),
    ("speedup", "speedup"),
    ("floor_ms", "floor"),
    ("roof", "roof"),
)
"""(column key, label); times in ms. 'roof' is floor_ms / ms: how close the shape runs to its roofline bound."""
GRAPH_COLUMNS = COLUMNS[:6] + (("graph_speedup", "graph"),) + COLUMNS[6:]
"""The columns once an evaluation carries CUDA-graph times (task graph_timing, --graph): the speedup as graph
replays, placed beside the event speedup so it stays in view on a 120-column terminal (floor and roof scroll)."""


def latest_evaluated(state: SessionState) -> Attempt | None:
    """The attempt whose evaluation finished last (a re-evaluation counts as the latest)."""
    evaluated = [a for a in state.attempts.values() if a.eval_seq is not None]
    return max(evaluated, key=lambda a: a.eval_seq or 0) if evaluated else None


def _natural(name: str) -> list[Any]:
    """S2 before S10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


class EvalTable(Pane):
    """The shapes table plus the verdict line of the latest evaluation."""

    DEFAULT_CSS = """
    EvalTable { height: auto; }
    EvalTable > KeyedTable { height: auto; max-height: 12; background: $surface; scrollbar-size: 1 1; }
    EvalTable > #verdict { height: auto; max-height: 3; padding: 0 1; color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.shown: tuple[int, int | None, int | None] | None = None
        """(attempt, eval seq, best) drawn last: the table changes only when one of them does."""

    def compose(self) -> ComposeResult:
        yield KeyedTable(*(Column(key, label) for key, label in COLUMNS), id="shapes")
        yield Static("", id="verdict")

    def on_mount(self) -> None:
        self.border_title = "evaluation"
        self.query_one("#verdict", Static).update("no evaluation yet")
        # Cell colours come from the theme, so a theme change has to redraw the cells.
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.redraw())

    def redraw(self) -> None:
        """Draw the current evaluation again (after a theme change)."""
        self.shown = None
        state = getattr(self.app, "state", None)
        if isinstance(state, SessionState):
            self.show(state)

    def show(self, state: SessionState) -> None:
        """Show the latest evaluation in `state`; a no-op when it is already shown."""
        attempt = latest_evaluated(state)
        if attempt is None:
            return
        key = (attempt.n, attempt.eval_seq, state.best)
        if key == self.shown:
            return
        self.shown = key
        best = state.best_attempt
        best_ms = {s.get("name"): s.get("ms") for s in best.shapes} if best is not None else {}
        table = self.query_one("#shapes", KeyedTable)
        graph = "graph_speedup" in table.columns or any(s.get("graph_speedup") is not None for s in attempt.shapes)
        columns = GRAPH_COLUMNS if graph else COLUMNS
        shapes = sorted(attempt.shapes, key=lambda s: _natural(str(s.get("name", "?"))))
        rows = {str(s.get("name", "?")): self._cells(s, best_ms.get(s.get("name"))) for s in shapes}
        with self.app.batch_update():
            if graph and "graph_speedup" not in table.columns:
                # Once per session: the first evaluation with graph times re-lays the table out.
                table.set_columns([Column(key, label) for key, label in columns])
            table.sync_rows({name: [cells[key] for key, _label in columns] for name, cells in rows.items()})
        self._describe(attempt, state)

    def _cells(self, shape: Mapping[str, Any], best_ms: float | None) -> dict[str, Text]:
        """Every column's cell for one shape, by column key (the table shows those its layout has)."""
        variables = self.app.theme_variables
        good, bad = theme_style(variables, "text-success"), theme_style(variables, "text-error")
        correct = shape.get("correct")
        time, floor = shape.get("ms"), shape.get("floor_ms")
        roof = floor / time if isinstance(floor, (int, float)) and isinstance(time, (int, float)) and time > 0 else None
        faster = best_ms is not None and time is not None and time < best_ms * 0.999

        def speedup(value: Any) -> Text:
            if not isinstance(value, (int, float)):
                return Text(fmt.DASH, style=MUTED, justify="right")
            return Text(fmt.speedup(value), style=good if value >= 1 else bad, justify="right")

        return {
            "shape": Text(str(shape.get("name", "?")), style=theme_style(variables, "text-primary", bold=True)),
            "correct": Text("✓", style=good) if correct else Text("✗" if correct is False else fmt.DASH, style=bad),
            "rel_err": Text(fmt.rel_err(shape.get("rel_err")), style=bad if correct is False else MUTED,
                            justify="right"),
            "ms": Text(fmt.ms(time), style=good if faster else "", justify="right"),
            "baseline_ms": Text(fmt.ms(shape.get("baseline_ms")), style=MUTED, justify="right"),
            "speedup": speedup(shape.get("speedup")),
            "graph_speedup": speedup(shape.get("graph_speedup")),
            "floor_ms": Text(fmt.ms(floor), style=MUTED, justify="right"),
            "roof": Text(f"{roof:.0%}" if roof is not None else fmt.DASH, style=MUTED, justify="right"),
        }

    def _describe(self, attempt: Attempt, state: SessionState) -> None:
        star = " ★" if state.best == attempt.n else ""
        comparable = "timing comparable" if attempt.timing_comparable else "timing NOT comparable"
        measured = f" · on {attempt.slot}" if attempt.slot else ""
        self.set_titles(Content.assemble(f"evaluation · attempt {attempt.n}{star} · ",
                                         (attempt.verdict or "?", f"bold ${verdict_variable(attempt.verdict)}")),
                        Content(f"{state.device or '?'}{measured} · {comparable}"))
        parts: list[str | tuple[str, str]] = []
        if attempt.speedup is not None:
            parts += ["overall ", (fmt.speedup(attempt.speedup), f"bold ${verdict_variable(attempt.verdict)}")]
        if attempt.ms is not None:
            parts += [f"  total {fmt.ms(attempt.ms)} ms"]
        best = state.best_attempt
        if best is not None and best.n != attempt.n:
            parts += [("  best ", ""), (f"#{best.n} {fmt.speedup(best.speedup)}", "$text-success")]
        if attempt.message and attempt.verdict != "ok":
            parts += ["\n" if parts else "", (attempt.message, f"${verdict_variable(attempt.verdict)}")]
        update_static(self.query_one("#verdict", Static), Content.assemble(*parts) if parts else Content(attempt.message))
