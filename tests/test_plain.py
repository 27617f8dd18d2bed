"""map_leaves, the one walk over plain data, and the two NaN passes built on it."""

import math

from workbench.agent.evaluation import json_safe
from workbench.evaluator import verdict
from workbench.plain import map_leaves


def test_map_leaves_rebuilds_every_container_and_maps_only_the_leaves_in_order():
    seen: list = []

    def leaf(value):
        seen.append(value)
        return value * 10 if isinstance(value, int) else value

    assert map_leaves({"a": (1, [2, {"b": 3}]), "c": "x", "d": {}}, leaf) == {"a": [10, [20, {"b": 30}]], "c": "x",
                                                                             "d": {}}
    assert seen == [1, 2, 3, "x"]


def test_the_journal_names_nan_and_inf_where_the_evaluator_drops_them():
    raw = {"shapes": [{"rel_err": float("nan"), "ms": 1.5}], "speedup": float("inf"), "n": (math.pi,)}
    assert json_safe(raw) == {"shapes": [{"rel_err": "nan", "ms": 1.5}], "speedup": "inf", "n": [math.pi]}
    assert verdict.clean(raw) == {"shapes": [{"rel_err": None, "ms": 1.5}], "speedup": None, "n": [math.pi]}
