"""Optimal static trees for a measured acceptance profile (Sequoia-style dynamic programming).

Model (positional acceptance): the rank-r child of an accepted node at depth d-1 is accepted with probability
p[d-1][r], whatever else the tree holds. At most one child of a node is accepted, so a node is on the
accepted path with probability equal to the product of p along its path (its *value*), and

    expected drafted tokens accepted per step = sum of the values of all nodes      (tau = 1 + that)

Trees are Medusa-style choice lists (`(0, 1)` = first choice at depth 1, then the second after it), with
sibling ranks used in order: a rank-r child needs ranks 0..r-1 beside it, because a drafter can only offer
its r-th guess after the better ones. Under that constraint the best tree is not simply the `budget` most
valuable nodes (measured p need not fall with rank), so we solve it exactly:

    G(d, n) = best total value below a node at depth d using at most n nodes
            = a knapsack over its children's ranks 0, 1, 2, ... (each a prefix of ranks), where giving the
              rank-r child m nodes is worth p[d][r] * (1 + G(d + 1, m - 1)).

Depths past the profile's last row reuse that row, so without a depth cap all those levels share one table
and the work is O(rows x ranks x budget^2).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from specdec.errors import ConfigError
from specdec.tree.spec import Choice, static


@dataclass(frozen=True)
class AcceptanceProfile:
    """p[d-1][r]: P(the rank-r child of an accepted depth-(d-1) node is accepted); ranks past a row's end are 0."""

    rows: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if not self.rows or not any(self.rows):
            raise ConfigError("an acceptance profile needs at least one depth with one rank")
        for d, row in enumerate(self.rows, start=1):
            for r, p in enumerate(row):
                if not (isinstance(p, (int, float)) and math.isfinite(p) and 0.0 <= p <= 1.0):
                    raise ConfigError(f"acceptance p[depth {d}][rank {r}] must be a probability in [0, 1], got {p!r}")

    def p(self, depth: int, rank: int) -> float:
        """Acceptance of a rank-`rank` node at `depth` (>= 1), given its parent was accepted."""
        row = self.rows[min(depth, len(self.rows)) - 1]
        return float(row[rank]) if rank < len(row) else 0.0

    @staticmethod
    def of(source: Any, min_offered: int = 10) -> "AcceptanceProfile":
        """A profile from a profile, an `AcceptanceReport`, `AcceptanceStats`, or a plain matrix p[depth][rank].

        From measured counts, a (depth, rank) cell offered fewer than `min_offered` times is taken as 0 (never
        worth a node): a rank seen twice and accepted once is noise, not a 50% chance. Trailing depths with
        no usable cell are dropped (deeper levels then reuse the last measured one).
        """
        if isinstance(source, AcceptanceProfile):
            return source
        stats = getattr(source, "stats", source)
        if hasattr(stats, "rank_offered"):
            rows = [tuple(a / o if o >= max(min_offered, 1) else 0.0 for a, o in zip(acc, off))
                    for acc, off in zip(stats.rank_accepted, stats.rank_offered)]
            while rows and not any(rows[-1]):
                rows.pop()
            if not rows:
                raise ConfigError(f"the report has no (depth, rank) offered at least {min_offered} times; "
                                  "measure more steps or lower min_offered")
            return AcceptanceProfile(tuple(rows))
        try:
            return AcceptanceProfile(tuple(tuple(float(p) for p in row) for row in source))
        except TypeError:
            raise ConfigError("an acceptance profile is a matrix p[depth][rank], a report or its stats") from None


def expected_accepted_length(choices: Sequence[Sequence[int]], profile: Any) -> float:
    """Expected drafted tokens accepted per step for a tree (choice list) under a positional profile."""
    profile = AcceptanceProfile.of(profile)
    spec = static([tuple(c) for c in choices])  # validates: parents present, sibling ranks in order
    total = 0.0
    for choice in spec.choices:
        value = 1.0
        for depth, rank in enumerate(choice, start=1):
            value *= profile.p(depth, rank)
        total += value
    return total


def optimal_tree(profile: Any, budget: int, max_depth: int | None = None, max_rank: int | None = None) -> list[Choice]:
    """The choice list of at most `budget` nodes with the largest expected accepted length.

    `max_depth` caps the depth and `max_rank` the ranks used (a drafter's top-k). Nodes worth nothing are left
    out, so a profile with few non-zero cells may give a smaller tree. Ties go to the smaller tree.
    """
    profile = AcceptanceProfile.of(profile)
    if not isinstance(budget, int) or budget < 1:
        raise ConfigError(f"a tree budget must be a positive number of nodes, got {budget!r}")
    if max_depth is not None and max_depth < 1:
        raise ConfigError(f"max_depth must be >= 1, got {max_depth}")
    ranks = min(max(len(row) for row in profile.rows), budget)
    if max_rank is not None:
        ranks = min(ranks, max_rank)
    levels = len(profile.rows) if max_depth is None else max_depth  # distinct tables: level l = nodes at depth l
    # best[l][n]: G(l, n); pick[l][r][n]: nodes given to the rank-r child (0 = no rank r or later) when the
    # ranks r, r+1, ... of a depth-l node share n nodes.
    best: list[list[float]] = [[0.0] * (budget + 1) for _ in range(levels + 1)]
    pick: list[list[list[int]]] = [[[0] * (budget + 1) for _ in range(ranks + 1)] for _ in range(levels + 1)]
    for level in range(levels - 1, -1, -1):
        # Without a depth cap, the last level's children are on that same level again (same row of p).
        below = best[level] if (max_depth is None and level == levels - 1) else best[level + 1]
        row = [profile.p(level + 1, r) for r in range(ranks)]
        tail = [[0.0] * (budget + 1) for _ in range(ranks + 1)]  # H(level, r, n)
        for n in range(budget + 1):
            for r in range(ranks - 1, -1, -1):
                value, choice = 0.0, 0
                for m in range(1, n + 1):
                    candidate = row[r] * (1.0 + below[m - 1]) + tail[r + 1][n - m]
                    if candidate > value + 1e-12:
                        value, choice = candidate, m
                tail[r][n] = value
                pick[level][r][n] = choice
            best[level][n] = tail[0][n]
    choices: list[Choice] = []

    def build(level: int, n: int, path: Choice) -> None:
        for r in range(ranks):
            m = pick[level][r][n]
            if m == 0:
                return
            child = path + (r,)
            choices.append(child)
            deeper = level if (max_depth is None and level == levels - 1) else level + 1
            build(deeper, m - 1, child)
            n -= m

    build(0, budget, ())
    return sorted(choices, key=lambda c: (len(c), c))


def save_tree(choices: Sequence[Sequence[int]], path: str | Path, profile: Any = None,
              meta: dict[str, Any] | None = None) -> Path:
    """Write a static tree file that `--tree static:FILE` (`parse_tree_spec`) reads: {"choices": [...], ...}.

    With a profile, the file also records the profile and the tree's expected accepted length under it.
    """
    spec = static([tuple(c) for c in choices])
    data: dict[str, Any] = {"choices": [list(c) for c in spec.choices], "nodes": spec.budget, "depth": spec.depth}
    if profile is not None:
        profile = AcceptanceProfile.of(profile)
        expected = expected_accepted_length(spec.choices, profile)
        data.update(expected_accepted=round(expected, 6), expected_tau=round(1.0 + expected, 6),
                    profile=[list(row) for row in profile.rows])
    data.update(meta or {})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # One key per line, each value on one line: a 16-node tree stays readable at a glance.
    path.write_text("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items()) + "\n}\n")
    return path
