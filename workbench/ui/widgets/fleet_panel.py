"""FleetPanel: the run's evaluation slots: each slot's GPU and host, what it evaluates and how far it is, the queue,
and the slots taken out of service.

Two sources are merged. The journal (SessionState.slots, folded from run.started, eval.started, eval.finished and
fleet.slot) says which attempt each slot holds, how many it has done and its faults; it is all an attached TUI or
a review has. A TUI that runs the agent also gets the runtime's FleetView (not journaled: phases change too often),
which adds each evaluation's current step and the queue as the pool sees it.
"""

from __future__ import annotations

from typing import Any, Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.content import Content

from workbench.agent.sink import FleetView
from workbench.session.state import SessionState
from workbench.ui import formatting as fmt
from workbench.ui.palette import MUTED, theme_style
from workbench.ui.widgets.keyed_table import Column, KeyedTable
from workbench.ui.widgets.pane import Pane

COLUMNS = (("slot", "slot", 7), ("where", "gpu · host", 11), ("state", "state", 7), ("attempt", "attempt", 7),
           ("doing", "doing", 11), ("done", "evals", 5))
"""(column key, label, width): the widths and cell padding fill the side pane's 60 columns, as the profile's do."""

STATE_VARIABLES = {"busy": "text-success", "idle": "foreground-muted", "faulted": "text-warning",
                   "retired": "text-error", "skipped": "text-warning"}
"""The theme colour of each slot state."""


def where(slot: Mapping[str, Any]) -> str:
    """'H200 #1', 'H200 #3@node-b' or 'cpu': the GPU model and index, and the host when it is another one."""
    if slot.get("device") != "cuda" and slot.get("gpu") is None:
        place = "cpu"
    else:
        model = str(slot.get("gpu_name") or "GPU").replace("NVIDIA ", "")
        place = f"{model} #{slot.get('gpu', '?')}"
    return place + (f"@{slot['host']}" if slot.get("host") else "")


def fleet_rows(state: SessionState, view: FleetView | None) -> dict[str, dict[str, Any]]:
    """Every slot the session knows, by name, in the pool's order: the journal's record with the live view's
    state, job and phase laid over it."""
    rows: dict[str, dict[str, Any]] = {}
    names = [s.info.slot for s in view.slots] if view is not None else []
    for name in [*names, *(n for n in state.slots if n not in names)]:
        rows[name] = dict(state.slots.get(name) or {"slot": name, "state": "idle", "evaluations": 0, "faults": []})
        rows[name]["phase"] = ""
    for status in view.slots if view is not None else ():
        row = rows[status.info.slot]
        row.update({k: v for k, v in status.info.to_dict().items() if v is not None})
        row["state"], row["phase"] = status.state, status.phase
        row["attempt"] = status.job.attempt if status.job is not None else None
        row["kind"] = status.job.kind if status.job is not None else ""
        row["evaluations"] = max(int(row.get("evaluations", 0)), status.evaluations)
        row["faults"] = row.get("faults") or list(status.faults)
    for job in state.jobs.values():  # the journal knows what each busy slot is for
        taken = rows.get(job.get("slot_taken", ""))
        if taken is not None and taken.get("attempt") == job["attempt"] and not taken.get("kind"):
            taken["kind"] = job.get("kind", "candidate")
    return rows


def queued(state: SessionState, view: FleetView | None) -> int:
    """Jobs waiting for a slot: the pool's count when live, else the journal's (queued, not started)."""
    if view is not None:
        return view.queued
    return sum(1 for job in state.jobs.values() if not job.get("slot_taken"))


class FleetPanel(Pane):
    """One row per slot, changed by key; hidden while the session has no slots (journals from before the fleet)."""

    DEFAULT_CSS = """
    FleetPanel { height: auto; }
    FleetPanel.-empty { display: none; }
    FleetPanel > KeyedTable { height: auto; max-height: 9; background: $surface; scrollbar-size: 1 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="-empty")
        self._shown: tuple[Any, ...] | None = None
        """What was drawn last: redraws happen only when a row, the queue or the reference changes."""
        self._inputs: tuple[SessionState, FleetView | None] | None = None
        """The state and view shown last, for a redraw after a theme change."""

    def compose(self) -> ComposeResult:
        yield KeyedTable(*(Column(key, label, width) for key, label, width in COLUMNS), id="slots")

    def on_mount(self) -> None:
        self.border_title = "fleet"
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.redraw())

    def redraw(self) -> None:
        """Draw the same slots again (cell colours come from the theme)."""
        self._shown = None
        if self._inputs is not None:
            self.show(*self._inputs)

    def show(self, state: SessionState, view: FleetView | None = None) -> None:
        """Show the slots of `state` with the live `view` laid over them; a no-op when nothing changed."""
        self._inputs = (state, view)
        rows = fleet_rows(state, view)
        waiting = queued(state, view)
        key = (tuple((n, r.get("state"), r.get("attempt"), r.get("kind"), r.get("phase"), r.get("evaluations"),
                      len(r.get("faults") or [])) for n, r in rows.items()), waiting, state.reference)
        if key == self._shown:
            return
        self._shown = key
        self.set_class(not rows, "-empty")
        self.query_one(KeyedTable).sync_rows({name: self._cells(row, name == state.reference)
                                              for name, row in rows.items()})
        out = [r for r in rows.values() if r.get("state") in ("retired", "skipped", "faulted")]
        busy = sum(1 for r in rows.values() if r.get("state") == "busy")
        self.set_titles(Content.assemble(
            f"fleet · {busy}/{len(rows)} busy · ", (f"{waiting} queued", "bold" if waiting else "$text-muted"),
            (f" · ref {state.reference}" if state.reference else "", "$text-muted")), Content(fmt.shorten(
                "out of service: " + ", ".join(f"{r.get('slot')} {r.get('state')}" for r in out), 58) if out else ""))

    def _cells(self, row: Mapping[str, Any], reference: bool) -> list[Text]:
        variables = self.app.theme_variables
        state = str(row.get("state") or "idle")
        attempt = row.get("attempt")
        kind = row.get("kind") or ""
        phase = row.get("phase") or ""
        if state == "busy" and not phase:
            phase = "held-out check" if kind == "heldout" else "evaluating"
        elif state in ("retired", "skipped", "faulted") and not phase:
            phase = (row.get("faults") or [state])[-1]
        return [
            Text(fmt.shorten(str(row.get("slot", "?")), 6) + ("★" if reference else ""),
                 style=theme_style(variables, "text-primary", bold=reference)),
            Text(fmt.shorten(where(row), 11), style=MUTED),
            Text(state, style=theme_style(variables, STATE_VARIABLES.get(state, "foreground-muted"))),
            Text(f"#{attempt}" + (" chk" if kind == "heldout" else "") if attempt is not None else fmt.DASH,
                 style="" if attempt is not None else MUTED, justify="right"),
            Text(fmt.shorten(str(phase), 11), style=MUTED),
            Text(str(row.get("evaluations", 0)), style=MUTED, justify="right"),
        ]
