"""The TUI's collector policy: survivors of each full collection frozen, the freeze lifted every REFREEZE_S, all of
it undone when the app closes."""

from __future__ import annotations

import gc

from tests.snapshot_apps.live_app import make_live_app
from workbench.ui import collector
from workbench.ui.collector import FrozenSurvivors


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_survivors_of_full_collections_are_frozen_and_the_freeze_is_lifted_every_period() -> None:
    clock = Clock()
    policy = FrozenSurvivors(clock)
    try:
        policy.install()
        assert policy.installed and gc.get_freeze_count() > 0
        frozen = gc.get_freeze_count()
        kept = [[object()] for _ in range(2000)]  # new survivors
        gc.collect(1)  # not a full collection: nothing more is frozen
        assert gc.get_freeze_count() == frozen
        gc.collect()
        assert gc.get_freeze_count() >= frozen + len(kept)
        clock.now = collector.REFREEZE_S + 1
        gc.collect()  # the period is over: this one lifts the freeze
        assert gc.get_freeze_count() == 0
        gc.collect()  # and the next one freezes its survivors again
        assert gc.get_freeze_count() > 0
    finally:
        policy.uninstall()
    assert not policy.installed and gc.get_freeze_count() == 0
    assert policy._on_collection not in gc.callbacks


async def test_the_app_installs_the_policy_while_it_runs_and_removes_it_when_it_closes() -> None:
    app, _runtime = make_live_app()
    async with app.run_test(size=(120, 40)):
        assert app._collector.installed and app._collector._on_collection in gc.callbacks
        assert gc.get_freeze_count() > 0
    assert not app._collector.installed and app._collector._on_collection not in gc.callbacks
    assert gc.get_freeze_count() == 0
