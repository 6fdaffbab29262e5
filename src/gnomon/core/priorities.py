"""Weighted priorities: which tier's waiting run gets the next free worker slot.

Under contention (more READY runs than free slots) high, normal and low start in the
proportions of their weights (70/20/10 by default), and none starves: a tier with a
backlog gets a slot at least once every ``sum(weights)`` picks. Without contention
every run starts at once and the weights never matter. A tier with nothing waiting
gives its share to the others (the picker only chooses among ``available`` tiers).

Smooth weighted round-robin (nginx's): each pick adds every available tier's weight to
its credit, takes the tier with the most credit and charges it the total. Picks are
spread evenly (7/2/1 gives H H N H H L H H N H, not seven H, then two N, then L) and
deterministic.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

DEFAULT_WEIGHTS: tuple[int, int, int] = (70, 20, 10)  # high, normal, low
WEIGHT_MAX = 1_000


def parse_weights(text: str) -> tuple[int, int, int]:
    """``"70,20,10"`` -> (70, 20, 10); ValueError naming the rule otherwise."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError("priority weights are three whole numbers for high,normal,low, like 70,20,10")
    weights = (int(parts[0]), int(parts[1]), int(parts[2]))
    check_weights(weights)
    return weights


def check_weights(weights: Sequence[int]) -> None:
    if len(weights) != 3 or not all(1 <= w <= WEIGHT_MAX for w in weights):
        raise ValueError(f"each priority weight must be between 1 and {WEIGHT_MAX} (0 would starve a tier)")


@dataclass
class WeightedPicker:
    """Smooth weighted round-robin over tiers 0..n-1 (0 = high)."""

    weights: Sequence[int] = DEFAULT_WEIGHTS
    _credit: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_weights(self.weights)
        self._credit = [0] * len(self.weights)

    def pick(self, available: Collection[int]) -> int:
        """The tier to serve next, among ``available`` (non-empty)."""
        assert available, "pick needs at least one tier with a waiting run"
        total = 0
        best = -1
        for tier in sorted(available):
            self._credit[tier] += self.weights[tier]
            total += self.weights[tier]
            if best < 0 or self._credit[tier] > self._credit[best]:
                best = tier
        self._credit[best] -= total
        return best
