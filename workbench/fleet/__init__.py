"""Evaluation slots: many evaluations in flight (one per GPU, on this host or across hosts), one journal writer.

`make_pool` (workbench.fleet.factory) builds the pool a run uses; `workbench.fleet.api` is its contract.
"""

from workbench.fleet.api import FleetError
from workbench.fleet.factory import make_pool, preflight

__all__ = ["FleetError", "make_pool", "preflight"]
