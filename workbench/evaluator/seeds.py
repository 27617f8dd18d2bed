"""Secret input seeds: a pool per shape for the correctness checks, and fresh ones, never reused, for timing.

Seeds come from os.urandom in the trusted process, so no candidate can precompute outputs for them (seeds 0, 1, 2
could be). The pool is reused across evaluations, which is what lets the service keep the oracle's outputs, and is
refreshed over a run: every `refresh_every` evaluations each shape's oldest seed is replaced. A reused pool means a
candidate could store correct outputs for pooled inputs between evaluations and replay them; it gains nothing from
that on correctness (it could only replay outputs it computed itself), and timing never uses pooled inputs: every
evaluation times on fresh seeds drawn for it alone.

A task's make_inputs may pick an input family by seed % k (softmax's offset and heavy-tailed logits): every seed of
slot i is congruent to i modulo SLOT_MODULUS, so slot i sees the family seed i would for any k dividing it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

SLOT_MODULUS = 840
"""lcm(1..8): seed % k == slot % k for every family count k <= 8 (and any divisor of 840)."""
RANDOM_BITS = 30
"""Random part of a secret seed: about 10^9 seeds per slot. Seeds stay under 2^40, so a make_inputs that scales its
seed (softmax multiplies by about 2^20 before seeding) stays inside torch's 64-bit generator seed."""


def _random() -> int:
    return int.from_bytes(os.urandom(8), "little") & ((1 << RANDOM_BITS) - 1)


def secret_seed(slot: int, draw: Callable[[], int] = _random) -> int:
    """A fresh secret seed for slot `slot` (slot = seed % SLOT_MODULUS)."""
    return draw() * SLOT_MODULUS + slot


class SeedPool:
    """Per-shape pools of `size` correctness seeds and a stream of fresh timing seeds, secret or fixed.

    Fixed mode (secret=False) gives seeds 0..size-1 and fresh seeds size, size+1, ...: reproducible evaluations for
    tests and for comparing against the evaluator of before the service.
    """

    def __init__(self, size: int, *, secret: bool = True, refresh_every: int = 8,
                 draw: Callable[[], int] = _random) -> None:
        self.size = size
        """Correctness seeds per shape."""
        self.secret = secret
        self.refresh_every = refresh_every
        """Evaluations between two refreshes (0: never refresh)."""
        self._draw = draw
        self._pools: dict[str, list[int]] = {}
        self._oldest: dict[str, int] = {}
        """Per shape, the slot replaced at the next refresh (slots age in turn)."""
        self._fresh: dict[str, int] = {}
        """Fixed mode: per shape, the next fresh seed."""
        self.retired: list[tuple[str, int]] = []
        """(shape, seed) pairs refreshed out of a pool since the caller last looked (their cached outputs can go)."""

    def seeds(self, shape: str) -> list[int]:
        """The shape's current correctness seeds, slot by slot."""
        pool = self._pools.get(shape)
        if pool is None:
            pool = [secret_seed(i, self._draw) if self.secret else i for i in range(self.size)]
            self._pools[shape] = pool
        return list(pool)

    def fresh(self, shape: str, slot: int) -> int:
        """A timing seed for slot `slot` that no evaluation has used and no pool holds."""
        if self.secret:
            pooled = set(self._pools.get(shape, []))
            while True:
                seed = secret_seed(slot, self._draw)
                if seed not in pooled:
                    return seed
        n = self._fresh.get(shape, self.size)
        self._fresh[shape] = n + 1
        return n

    def after_evaluation(self, count: int) -> None:
        """Called with the number of evaluations served so far: refresh one slot of every pool when it is time."""
        if not self.secret or not self.refresh_every or count % self.refresh_every:
            return
        for shape, pool in self._pools.items():
            slot = self._oldest.get(shape, 0)
            old = pool[slot]
            pool[slot] = secret_seed(slot, self._draw)
            self._oldest[shape] = (slot + 1) % self.size
            self.retired.append((shape, old))
