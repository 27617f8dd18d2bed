"""MemoryPanel: what the agent is held to (the goal and active nudges) and what it has learned (ledger, memory)."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Static

from workbench.session.state import SessionState
from workbench.ui import formatting as fmt
from workbench.ui.static_text import update_static

Part = str | tuple[str, str]

LABEL = 10
"""Width of the label column; long values wrap under their value, not under the label."""

RECENT_NUDGES = 2
"""Delivered one-off nudges still listed (dimmed), so the person sees theirs was taken."""

LEDGER_SHOWN = 8
"""Newest ledger entries listed; the full ledger is in the journal and, later, the review screen."""

_STATUS_STYLE = {
    "worked": "$text-success", "kept": "$text-success", "ok": "$text-success", "success": "$text-success",
    "best": "$text-success", "failed": "$text-error", "rejected": "$text-error", "incorrect": "$text-error",
    "dead": "$text-error", "open": "$text-accent", "trying": "$text-accent", "pending": "$text-accent",
    "succeeded": "$text-success", "planned": "$text-accent", "partial": "$text-warning", "dropped": "$foreground-muted",
}


class MemoryPanel(VerticalScroll):
    """The goal contract, active nudges, the strategy ledger and the compacted memory, newest last."""

    DEFAULT_CSS = """
    MemoryPanel {
        height: 1fr;
        border: round $border-blurred;
        border-title-color: $text-primary;
        background: $surface;
        padding: 0 1;
        scrollbar-size-vertical: 1;
    }
    MemoryPanel:focus-within, MemoryPanel:focus { border: round $border; }
    MemoryPanel > Static { width: 1fr; }
    """

    def __init__(self, *, review: bool = False, id: str | None = None) -> None:
        super().__init__(id=id)
        self.review = review
        """Review leaves out the goal (it never changes; the ledger at the step is the point) and the nudge hint."""
        self.shown: tuple[Any, ...] | None = None
        """Fingerprint of what is drawn; redraws happen only when the goal, nudges, ledger or memory change."""
        self.state: SessionState | None = None
        """The state drawn last (the live state, or a review step's view of it), kept for a redraw on resize."""

    def compose(self) -> ComposeResult:
        yield Static("", id="memory-text")

    def on_mount(self) -> None:
        self.border_title = "goal · nudges · ledger"

    def show(self, state: SessionState) -> None:
        """Redraw from `state` if anything this panel shows has changed."""
        self.state = state
        key = (
            state.task, state.device, repr(state.goal), repr(state.budget),
            tuple((n["id"], n["acked"], n["active"]) for n in state.nudges),
            repr(state.ledger), repr(state.memory),
        )
        if key == self.shown:
            return
        self.shown = key
        update_static(self.query_one("#memory-text", Static), Content.assemble(*self._parts(state)))

    def on_resize(self) -> None:
        # Values are wrapped to the panel's width, so a new width needs a new layout of the text.
        self.shown = None
        if self.state is not None:
            self.show(self.state)

    @property
    def _width(self) -> int:
        """Columns available to the text (the panel minus border, padding and scrollbar)."""
        return max(30, self.scrollable_content_region.width - 1)

    def _row(self, label: str, value: str) -> list[Part]:
        return [(f"{label:<{LABEL}}", "$foreground-muted"), fmt.hang(value, self._width, LABEL), "\n"]

    def _parts(self, state: SessionState) -> list[Part]:
        parts = [] if self.review else self._goal_parts(state)
        parts += self._learned_parts(state)
        if parts and parts[0] == "\n":
            parts.pop(0)
        if parts and parts[-1] == "\n":
            parts.pop()
        return parts

    def _goal_parts(self, state: SessionState) -> list[Part]:
        goal = state.goal
        parts: list[Part] = [(goal.get("task") or state.task or "no goal yet", "bold $text-primary")]
        if goal.get("description"):
            parts += ["\n", fmt.hang(goal["description"], self._width, 0)]
        parts.append("\n")
        if goal:
            parts += self._row("tolerance", fmt.tolerance(goal.get("tolerance")))
            metric = goal.get("metric")
            parts += self._row("baseline", fmt.baseline(goal.get("baseline")) + (f" · {metric}" if metric else ""))
            shapes = goal.get("shapes") or []
            if isinstance(shapes, dict):  # the task's public view keys shapes by device kind
                shapes = shapes.get("cpu" if state.device == "cpu" else "cuda") or []
            if shapes:
                parts += self._row("shapes", ", ".join(fmt.shape(s) for s in shapes[:4]) +
                                   (f" +{len(shapes) - 4}" if len(shapes) > 4 else ""))
            forbidden = goal.get("forbidden") or {}
            if isinstance(forbidden, dict) and forbidden:
                banned = [*forbidden.get("imports", []), *(f"torch.{op}" for op in forbidden.get("torch_ops", []))]
                parts += self._row("forbidden", fmt.shorten(", ".join(banned), 120))
        parts += self._row("device", state.device or fmt.DASH)
        parts += self._row("budget", fmt.budget(state.budget or {}))
        return parts

    def _learned_parts(self, state: SessionState) -> list[Part]:
        parts: list[Part] = []
        active = state.active_nudges()
        delivered = [n for n in state.nudges if not n["active"]][-RECENT_NUDGES:]
        parts += ["\n", ("nudges", "bold $text-primary")]
        if state.nudges:
            parts += [(f" {len(active)} active · ● persistent ○ once ✓ delivered", "$foreground-muted")]
        parts.append("\n")
        if not state.nudges:
            parts += [("none yet\n" if self.review else "press n to send the agent a hint\n", "$foreground-muted")]
        for nudge in active:
            parts += [("● " if nudge["persistent"] else "○ ", "$text-accent"), fmt.hang(nudge["text"], self._width, 2),
                      "\n"]
        for nudge in delivered:
            parts += [("✓ ", "$text-success"), (fmt.hang(nudge["text"], self._width, 2), "$foreground-muted"), "\n"]

        if state.ledger:
            parts += ["\n", (f"ledger ({len(state.ledger)})", "bold $text-primary"), "\n"]
            hidden = len(state.ledger) - LEDGER_SHOWN
            if hidden > 0:
                parts += [(f"  … {hidden} older\n", "$foreground-muted")]
            for entry in state.ledger[-LEDGER_SHOWN:]:
                status, text = fmt.ledger_entry(entry)
                style = _STATUS_STYLE.get(status.lower(), "$foreground-muted")
                parts += [(f"{status or '•':<{LABEL - 1}} ", style), fmt.hang(text, self._width, LABEL), "\n"]

        if state.memory:
            parts += ["\n", ("memory", "bold $text-primary"), "\n", (fmt.memory_summary(state.memory), ""), "\n"]
            dropped = state.memory.get("dropped")
            if isinstance(dropped, list) and dropped:
                # The compaction audit: what older context the agent no longer sees word for word.
                parts += self._row("dropped", fmt.shorten("; ".join(map(str, dropped)), 240))
        return parts
