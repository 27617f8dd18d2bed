"""Walks over plain data (dicts, lists and tuples of scalars, what JSON and the evaluator's wire carry).

One walk serves every "replace some leaves" pass: the evaluator's NaN-free results, the journal's NaN-safe results
and the slab's tensor descriptors differ only in what they do to a leaf.
"""

from __future__ import annotations

from typing import Any, Callable


def map_leaves(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """`value` rebuilt with `leaf(x)` in place of every x that is not a dict, list or tuple (tuples become lists,
    as in JSON); dict keys are kept as they are."""
    if isinstance(value, dict):
        return {k: map_leaves(v, leaf) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [map_leaves(v, leaf) for v in value]
    return leaf(value)
