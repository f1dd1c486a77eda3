"""Online calibration of drafters' confidence: how often a node like this one was really accepted.

A drafter's own score for a node (a suffix count ratio, a recycled rank, a draft model's probability) is on its
own scale, and a hybrid tree must rank nodes from different drafters against each other under one node
budget. So every node is keyed by *who proposed it* (a bitmask of drafters: a node two drafters agree on is
its own kind, usually better than either alone), its depth, and a log-scale bin of its raw score; per key we
count how many such nodes were *tried* (their parent was accepted, so the verifier looked at them) and how many
were *accepted*. The estimate is the acceptance rate with the raw score as a prior worth `prior_weight`
observations, so a new kind starts from what its drafter claims and moves to what the verifier does. Counts
are halved past `window` observations, so the estimate follows a workload that changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

NUM_BINS = 12


def score_bin(raw: float) -> int:
    """Log-scale bins: 1.0 -> 0, 0.7 -> 1, 0.5 -> 2, 0.35 -> 3, ... (small probabilities stay apart)."""
    if raw >= 1.0:
        return 0
    if raw <= 0.0:
        return NUM_BINS - 1
    return min(int(-2.0 * math.log2(raw)), NUM_BINS - 1)


class AcceptanceCalibration:
    def __init__(self, prior_weight: float = 8.0, window: float = 4096.0, max_depth: int = 16,
                 optimism: float = 0.0) -> None:
        self.prior_weight = prior_weight
        # Standard errors added to an estimate. A ranking that only ever verifies the nodes it already rates
        # well never learns that a kind it rates badly is better than its prior: with optimism, a kind with
        # little evidence is rated up until it has been tried enough to know.
        self.optimism = optimism
        self.window = window
        self.max_depth = max_depth
        self._counts: dict[tuple[int, int, int], list[float]] = {}  # key -> [tried, accepted]

    def key(self, sources: int, depth: int, raw: float) -> tuple[int, int, int]:
        return sources, min(depth, self.max_depth), score_bin(raw)

    def estimate(self, sources: int, depth: int, raw: float,
                 prior: Callable[[], float] | float | None = None) -> float:
        """P(accepted | parent accepted) for a node of this kind; `prior` defaults to the raw score."""
        counts = self._counts.get(self.key(sources, depth, raw))
        base = raw if prior is None else (prior() if callable(prior) else prior)
        base = min(max(base, 0.0), 1.0)
        tried, accepted = counts if counts is not None else (0.0, 0.0)
        estimate = (accepted + self.prior_weight * base) / (tried + self.prior_weight)
        if self.optimism:
            bonus = self.optimism * math.sqrt(estimate * (1.0 - estimate) / (tried + self.prior_weight))
            estimate = min(estimate + bonus, 1.0)
        return estimate

    def observe(self, sources: int, depth: int, raw: float, accepted: bool) -> None:
        key = self.key(sources, depth, raw)
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = [0.0, 0.0]
        counts[0] += 1.0
        counts[1] += float(accepted)
        if counts[0] > self.window:
            counts[0] *= 0.5
            counts[1] *= 0.5

    def observed(self, sources: int, depth: int, raw: float) -> tuple[float, float]:
        """(tried, accepted) counts behind an estimate (for reports and tests)."""
        tried, accepted = self._counts.get(self.key(sources, depth, raw), (0.0, 0.0))
        return tried, accepted

    def reset(self) -> None:
        self._counts.clear()
