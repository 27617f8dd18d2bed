"""ProfilerTable: the latest profile's kernel table and Nsight Compute metrics, with deltas against the best's profile.

Two layouts of profile.finished data are read. The flat one: {"attempt", "kernels": [{"name", "calls", "total_ms",
"mean_ms", "share"}], "ncu": {metric: value}, "summary"}. And workbench.profiler's evaluation profile: {"shapes":
[{"name", "kernels": [...]}], "ncu": {"rows": [{"kernel", "metrics": {...}}]}, "findings": [{"message"}]}, whose
per-shape tables are summed into one. Anything missing just leaves its part empty.
"""

from __future__ import annotations

from typing import Any, Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import Static

from workbench.ui import formatting as fmt
from workbench.ui.palette import MUTED, theme_style
from workbench.ui.widgets.keyed_table import Column, KeyedTable
from workbench.ui.widgets.pane import Pane

COLUMNS = (("name", "kernel", 17), ("calls", "calls", 5), ("total_ms", "total ms", 8), ("mean_ms", "mean ms", 7),
           ("share", "share", 5), ("delta", "Δ best", 6))
"""(column key, label, width): 'delta' is the mean time against the same kernel in the best attempt's profile.
The widths fill the 60 columns of the side pane exactly, so no horizontal scrollbar steals a row."""

NCU_SHOWN = 6
"""Nsight Compute metrics listed under the table; the full set is in the event (l opens it)."""


def kernel_rows(profile: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The kernel table of a profile.finished payload: rows with a name, heaviest first.

    Per-shape tables (the profiler's layout) are merged by kernel name: calls and total time add up, the mean and
    the share are recomputed over the merged rows.
    """
    rows = profile.get("kernels") or profile.get("rows")
    if not isinstance(rows, list):
        shapes = profile.get("shapes")
        if not isinstance(shapes, list):
            return []
        merged: dict[str, dict[str, Any]] = {}
        for shape in shapes:
            for row in (shape.get("kernels") or []) if isinstance(shape, Mapping) else []:
                if not isinstance(row, Mapping) or not row.get("name"):
                    continue
                into = merged.setdefault(str(row["name"]), {"name": str(row["name"]), "calls": 0, "total_ms": 0.0})
                into["calls"] += int(_number(row.get("calls"), 0) or 0)
                into["total_ms"] += _number(row.get("total_ms"), 0.0) or 0.0
        total = sum(r["total_ms"] for r in merged.values())
        for row in merged.values():
            row["mean_ms"] = row["total_ms"] / row["calls"] if row["calls"] else None
            row["share"] = row["total_ms"] / total if total > 0 else None
        rows = list(merged.values())
    named = [r for r in rows if isinstance(r, Mapping) and r.get("name")]
    return sorted(named, key=lambda r: -(_number(r.get("total_ms"), 0.0) or 0.0))


def ncu_metrics(profile: Mapping[str, Any]) -> dict[str, Any]:
    """Nsight Compute metrics as name -> number or text ({"value", "unit"} entries are unwrapped).

    In the profiler's layout (one row of metrics per kernel) the first row's kernel, the heaviest, is shown.
    """
    raw = profile.get("ncu") or profile.get("metrics") or {}
    if not isinstance(raw, Mapping):
        return {}
    if isinstance(raw.get("rows"), list):
        first = next((r for r in raw["rows"] if isinstance(r, Mapping) and isinstance(r.get("metrics"), Mapping)),
                     None)
        raw = first["metrics"] if first is not None else {}
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if isinstance(value, Mapping):
            value = value.get("value")
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            out[str(name)] = value
    return out


def _number(value: Any, default: float | None = None) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _share(value: Any) -> str:
    share = _number(value)
    if share is None:
        return fmt.DASH
    return f"{share:.0%}" if share <= 1 else f"{share:.0f}%"


def _metric_name(name: str) -> str:
    """'dram__throughput.avg.pct_of_peak_sustained_elapsed' as 'dram__throughput': the part a person scans for."""
    return name.split(".")[0]


class ProfilerTable(Pane):
    """Kernel rows changed by key; hidden while the session has no profile."""

    DEFAULT_CSS = """
    ProfilerTable { height: auto; }
    ProfilerTable.-empty { display: none; }
    ProfilerTable > KeyedTable { height: auto; max-height: 6; background: $surface; scrollbar-size: 1 1; }
    ProfilerTable > #ncu { height: auto; max-height: 4; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="-empty")
        self._shown: tuple[Any, Any] | None = None
        """(profile, best profile) objects drawn last; the state replaces the dict on each profile.finished."""

    def compose(self) -> ComposeResult:
        yield KeyedTable(*(Column(key, label, width) for key, label, width in COLUMNS), id="kernels")
        yield Static("", id="ncu")

    def on_mount(self) -> None:
        self.border_title = "profile"
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.redraw())

    def redraw(self) -> None:
        """Draw the same profile again (cell colours come from the theme)."""
        shown, self._shown = self._shown, None
        if shown is not None:
            self.show(*shown)

    def show(self, profile: Mapping[str, Any] | None, best: Mapping[str, Any] | None = None) -> None:
        """Show `profile` with deltas against `best` (the best attempt's profile, when it is another attempt's).

        A no-op when neither changed; the pane hides itself while there is nothing to show.
        """
        if self._shown is not None and self._shown[0] is profile and self._shown[1] is best:
            return
        self._shown = (profile, best)
        profile = profile or {}
        rows = kernel_rows(profile)
        metrics = ncu_metrics(profile)
        self.set_class(not rows and not metrics, "-empty")
        best_rows = {r["name"]: r for r in kernel_rows(best or {})}
        cells = {str(r["name"]): self._cells(r, best_rows.get(r["name"])) for r in rows}
        self.query_one(KeyedTable).sync_rows(cells)  # heaviest kernel first, as kernel_rows orders them
        self.query_one("#ncu", Static).update(self._ncu(metrics, ncu_metrics(best or {}), profile))
        attempt = profile.get("attempt")
        against = best.get("attempt") if best else None
        findings = profile.get("findings")
        first = findings[0].get("message") if isinstance(findings, list) and findings and \
            isinstance(findings[0], Mapping) else None
        self.set_titles(Content.assemble(f"profile · attempt {attempt}" if attempt is not None else "profile",
                                         (f" · Δ vs best #{against}" if against is not None else "", "$text-muted")),
                        Content(fmt.shorten(str(profile.get("summary") or first or ""), 60)))

    def _cells(self, row: Mapping[str, Any], best: Mapping[str, Any] | None) -> list[Text]:
        variables = self.app.theme_variables
        mean, best_mean = _number(row.get("mean_ms")), _number((best or {}).get("mean_ms"))
        if mean is not None and best_mean:
            change = mean / best_mean - 1
            style = theme_style(variables, "text-success" if change < -0.005 else
                                "text-error" if change > 0.005 else "foreground-muted")
            delta = Text(f"{change:+.0%}", style=style, justify="right")
        else:
            delta = Text(fmt.DASH, style=MUTED, justify="right")
        calls = row.get("calls")
        return [
            Text(fmt.shorten(str(row["name"]), 17), style=theme_style(variables, "text-primary")),
            Text(str(calls) if calls is not None else fmt.DASH, style=MUTED, justify="right"),
            Text(fmt.ms(_number(row.get("total_ms"))), justify="right"),
            Text(fmt.ms(mean), justify="right"),
            Text(_share(row.get("share")), style=MUTED, justify="right"),
            delta,
        ]

    @staticmethod
    def _ncu(metrics: Mapping[str, Any], best: Mapping[str, Any], profile: Mapping[str, Any]) -> Content:
        """The Nsight Compute line, and the profiler's own deltas against the best ('deltas', when journaled)."""
        parts: list[str | tuple[str, str]] = []
        deltas = profile.get("deltas")
        if isinstance(deltas, list) and deltas:
            against = profile.get("against")
            parts += [(f"vs #{against} " if against is not None else "vs best ", "bold $text-secondary"),
                      fmt.shorten(" · ".join(str(d) for d in deltas[:3]), 110)]
        if not metrics:
            return Content.assemble(*parts)
        if parts:
            parts.append("\n")
        parts.append(("ncu ", "bold $text-secondary"))
        for i, (name, value) in enumerate(list(metrics.items())[:NCU_SHOWN]):
            if i:
                parts.append((" · ", "$foreground-muted"))
            parts += [(f"{_metric_name(name)} ", "$foreground-muted"),
                      f"{value:.3g}" if isinstance(value, float) else str(value)]
            before = best.get(name)
            if isinstance(value, (int, float)) and isinstance(before, (int, float)) and value != before:
                parts.append((f" ({value - before:+.3g})", "$text-accent"))
        hidden = len(metrics) - NCU_SHOWN
        if hidden > 0:
            parts.append((f" +{hidden} more", "$foreground-muted"))
        return Content.assemble(*parts)

