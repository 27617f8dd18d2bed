"""The Task and Shape a task folder describes, and the roofline floor derived from them."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.devices import PEAKS, peaks_for  # noqa: F401 - PEAKS (the table, keyed by GPU name) is re-exported
from workbench.journal.events import TaskView
from workbench.tasks import roofline

SHAPE_GROUPS = ("cuda", "cpu", "heldout", "heldout_cpu")
"""The shape lists of a task: timed CUDA shapes, interpreter shapes, and their held-out counterparts."""

PUBLIC_GROUPS = ("cuda", "cpu")
"""The shape lists the agent may see; the held-out ones never leave the evaluator."""


class TaskError(Exception):
    """A task folder that cannot be used; the message is one line naming the file and the key."""


@dataclass(frozen=True)
class Shape:
    """One problem size: a name and the params `make_inputs` interprets (ints, floats, strings, bools)."""

    name: str
    params: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """Plain data, safe to put into JSON."""
        return {"name": self.name, "params": dict(self.params)}


@dataclass
class Task:
    """A loaded, validated task folder (kernels/<name>/)."""

    name: str
    description: str
    entry: str
    """The function a candidate defines, with the same parameters as reference.forward."""
    outputs: list[str]
    """Names of forward's outputs, in order."""
    tolerance: dict[str, Any]
    """``{"metric": "rel_rms", "value": float, "per_output": {output: float}}``."""
    roofline: dict[str, str]
    """``{"flops": expr, "bytes": expr}``: formulas over a shape's params."""
    forbidden_imports: list[str]
    forbidden_torch_ops: list[str]
    plausible_speedup: float
    shapes: dict[str, list[Shape]]
    """Keys cuda, cpu, heldout, heldout_cpu (each possibly empty)."""
    dir: Path
    reference: Path
    seed: Path
    baseline: Path | None = None
    graph_timing: bool = False
    """Also time both sides under CUDA graphs by default (launch-bound tasks: the figure a serving stack sees)."""
    _trees: dict[str, ast.Expression] = field(default_factory=dict, repr=False, compare=False)

    def tol(self, output: str) -> float:
        """The tolerance for one output: its per-output override, else the task-wide value."""
        return float(self.tolerance.get("per_output", {}).get(output, self.tolerance["value"]))

    def shape(self, name: str) -> Shape:
        """Find a shape by name in any group.

        Raises:
            KeyError: no shape has that name.
        """
        for group in SHAPE_GROUPS:
            for shape in self.shapes.get(group, []):
                if shape.name == name:
                    return shape
        raise KeyError(name)

    def work(self, shape: Shape | str) -> tuple[float, float]:
        """(flops, bytes) of one shape from the task's roofline formulas (never from kernel output)."""
        if isinstance(shape, str):
            shape = self.shape(shape)
        scope = roofline.names(shape.params)
        values = []
        for key in ("flops", "bytes"):
            tree = self._trees.get(key) or roofline.parse(self.roofline[key])
            self._trees[key] = tree
            values.append(roofline.evaluate(tree, scope))
        return values[0], values[1]

    def floor_ms(self, shape: Shape | str, device_kind: str = "cuda", gpu: str | None = None) -> float | None:
        """The roofline floor: max(bytes / peak bandwidth, flops / peak compute), in milliseconds.

        A time under it is physically impossible, so it can only be a measurement bug or a cheat.

        Args:
            shape: a Shape of this task or its name.
            device_kind: "cuda" or "cpu" (the Triton interpreter has no meaningful peak, so no floor).
            gpu: the GPU's name ("NVIDIA H200"); a name the peak table does not know, or None, takes the largest
                known peaks, so the floor is low but never wrongly high.

        Returns:
            The floor in ms, or None on the CPU.
        """
        if device_kind != "cuda":
            return None
        peaks = peaks_for(gpu)
        flops, nbytes = self.work(shape)
        return max(nbytes / peaks.bytes_per_s, flops / peaks.flops_per_s) * 1e3

    def public_view(self, gpu: str | None = None) -> TaskView:
        """Everything the agent may see: the goal contract without any held-out shape (names included).

        Args:
            gpu: the GPU the run times on, for the CUDA shapes' floor_ms (see floor_ms).
        """
        shapes: dict[str, list[dict[str, Any]]] = {}
        for group in PUBLIC_GROUPS:
            rows = []
            for shape in self.shapes.get(group, []):
                row = shape.to_dict()
                if group == "cuda":
                    row["floor_ms"] = self.floor_ms(shape, "cuda", gpu)
                rows.append(row)
            shapes[group] = rows
        return {
            "name": self.name,
            "description": self.description,
            "entry": self.entry,
            "outputs": list(self.outputs),
            "tolerance": {
                "metric": self.tolerance["metric"],
                "value": self.tolerance["value"],
                "per_output": dict(self.tolerance.get("per_output", {})),
            },
            "roofline": dict(self.roofline),
            "forbidden": {"imports": list(self.forbidden_imports), "torch_ops": list(self.forbidden_torch_ops)},
            "plausible_speedup": self.plausible_speedup,
            "graph_timing": self.graph_timing,
            "shapes": shapes,
            "files": {
                "reference": str(self.reference),
                "seed": str(self.seed),
                "baseline": str(self.baseline) if self.baseline else None,
            },
        }
