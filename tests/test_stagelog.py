"""StageLog: the lines `workbench eval --progress` writes for the steps the evaluation service announces."""

import io

from workbench.stagelog import SLOW_S, StageLog, describe, phase_of


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_describe_names_the_step_the_shape_and_whose_it_is():
    assert describe({"stage": "baseline", "trusted": True, "shape": "K4", "group": "timed"}) == "baseline K4"
    assert describe({"stage": "forward", "trusted": False, "shape": "K1", "seed": 2}) == "forward K1 (candidate)"
    assert describe({"stage": "precompile", "trusted": True}) == "precompile"


def test_one_line_per_step_and_shape_with_the_slow_gap_shown():
    out, clock = io.StringIO(), Clock()
    log = StageLog(out, clock=clock)
    clock.t += 1.0
    log({"stage": "baseline", "trusted": True, "shape": "K1"})
    clock.t += 207.2  # FLA autotuning for real on a GPU with no recorded choices
    log({"stage": "oracle", "trusted": True, "shape": "K1", "seed": 0})
    clock.t += 0.5
    log({"stage": "forward", "trusted": False, "shape": "K1", "seed": 0})
    log({"stage": "oracle", "trusted": True, "shape": "K1", "seed": 1})  # folded into the line already written
    log({"stage": "forward", "trusted": False, "shape": "K1", "seed": 1})
    clock.t += SLOW_S - 0.1
    log({"stage": "timing", "trusted": False, "shape": "K1"})
    assert out.getvalue().splitlines() == [
        "eval [    1.0 s] baseline K1",
        "eval [  208.2 s] oracle K1  (+207.2 s)",
        "eval [  208.7 s] forward K1 (candidate)",
        "eval [  213.6 s] timing K1 (candidate)",
    ]


def test_phase_of_is_the_fleet_views_phrase():
    assert phase_of({"stage": "forward", "trusted": False, "shape": "S1", "seed": 0}) == "forward S1"
    assert phase_of({"stage": "load", "trusted": False}) == "load"
