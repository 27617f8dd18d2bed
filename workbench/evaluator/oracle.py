"""The trusted process's store of prepared input sets: oracle outputs computed once, kept in bounded memory.

An entry is what the oracle (and the baseline) said about one (task hash, shape, seed): the expected outputs,
the dtypes a candidate must return, the inputs' fingerprint and the baseline's own error. Entries live in the
trusted process only (on the GPU when evaluating there) and never on disk, so neither the agent nor a candidate
can read them. The store is an LRU bounded in bytes; an evicted entry is simply computed again when next needed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, str, int]
"""(task hash, shape name, seed)."""


@dataclass
class Prepared:
    """What the trusted side knows about one input set before any candidate runs on it."""

    seed: int
    expected: list[Any]
    """The oracle's outputs (tensors on the evaluation device)."""
    dtypes: list[Any]
    """The dtypes a candidate must return (checks.expected_dtypes)."""
    fingerprint: dict[str, str]
    """inputs.fingerprint of the inputs make_inputs draws for this seed (the worker must report the same)."""
    baseline_err: dict[str, float] = field(default_factory=dict)
    """The baseline's rel_rms error per output on these inputs (empty when not measured: timing sets)."""
    nbytes: int = 0
    """Bytes the expected outputs hold."""


@dataclass
class CacheStats:
    """Counters reported with each evaluation and by the service's health."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions, "bytes": self.bytes,
                "entries": self.entries}


class OracleCache:
    """An LRU of Prepared entries bounded by the bytes of their expected outputs."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[Key, Prepared] = OrderedDict()
        self.stats = CacheStats()

    def get(self, key: Key) -> Prepared | None:
        """The entry for key (counted as a hit or a miss), most recently used from now on."""
        entry = self._entries.get(key)
        if entry is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(key)
        self.stats.hits += 1
        return entry

    def put(self, key: Key, entry: Prepared) -> None:
        """Keep an entry, evicting the least recently used ones past the budget (an entry above the whole budget
        is not kept at all)."""
        self.discard(key)
        if entry.nbytes > self.budget_bytes:
            return
        self._entries[key] = entry
        self.stats.bytes += entry.nbytes
        while self.stats.bytes > self.budget_bytes and self._entries:
            _, old = self._entries.popitem(last=False)
            self.stats.bytes -= old.nbytes
            self.stats.evictions += 1
        self.stats.entries = len(self._entries)

    def discard(self, key: Key) -> None:
        """Forget one entry (a seed refreshed out of its pool)."""
        old = self._entries.pop(key, None)
        if old is not None:
            self.stats.bytes -= old.nbytes
        self.stats.entries = len(self._entries)

    def clear(self) -> None:
        """Forget everything (the oracle ran out of memory and needs the room)."""
        self._entries.clear()
        self.stats.bytes = 0
        self.stats.entries = 0

    def __contains__(self, key: Key) -> bool:
        return key in self._entries
