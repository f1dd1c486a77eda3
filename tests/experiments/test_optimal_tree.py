"""The optimal-tree builder: exact expected values on hand-made profiles, the rank-order rule, the budget,
agreement with brute force, and tree files the engine's `static:FILE` reads."""

from __future__ import annotations

import json
import random

import pytest

from specdec.errors import ConfigError
from specdec.experiments import AcceptanceProfile, AcceptanceStats, expected_accepted_length, optimal_tree, save_tree
from specdec.tree.spec import TreeKind, parse_tree_spec, static

# p[depth-1][rank]; depths past the last row reuse it.
PROFILE = [[0.6, 0.3], [0.5, 0.2], [0.4, 0.1]]


def chain(k: int) -> list[tuple[int, ...]]:
    return [(0,) * d for d in range(1, k + 1)]


def test_expected_length_is_the_sum_of_path_products():
    # node values: (0)=.6 (1)=.3 (0,0)=.6*.5 (1,0)=.3*.5 (0,1)=.6*.2
    assert expected_accepted_length([(0,), (1,), (0, 0), (1, 0), (0, 1)], PROFILE) == pytest.approx(
        0.6 + 0.3 + 0.3 + 0.15 + 0.12, abs=1e-12)
    # a chain of 5: depths 4 and 5 reuse the last row
    assert expected_accepted_length(chain(5), PROFILE) == pytest.approx(
        0.6 + 0.3 + 0.12 + 0.048 + 0.0192, abs=1e-12)


def test_the_optimal_tree_beats_a_chain_of_the_same_size_by_the_hand_computed_margin():
    tree = optimal_tree(PROFILE, 4)
    assert tree == [(0,), (1,), (0, 0), (1, 0)]
    assert expected_accepted_length(tree, PROFILE) == pytest.approx(1.35, abs=1e-12)
    assert expected_accepted_length(chain(4), PROFILE) == pytest.approx(1.068, abs=1e-12)
    six = optimal_tree(PROFILE, 6)
    assert six == [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    assert expected_accepted_length(six, PROFILE) == pytest.approx(1.59, abs=1e-12)


def test_a_later_rank_is_used_only_after_the_earlier_ones():
    profile = [[0.1, 0.7]]  # the second guess is better than the first, but needs it beside it
    assert optimal_tree(profile, 1) == [(0,)]
    three = optimal_tree(profile, 3)
    assert three == [(0,), (1,), (1, 0)]
    assert expected_accepted_length(three, profile) == pytest.approx(0.1 + 0.7 + 0.07, abs=1e-12)
    with pytest.raises(ConfigError, match="sibling rank"):
        expected_accepted_length([(1,)], profile)


def test_budget_depth_and_rank_limits_are_respected():
    for budget in (1, 5, 16, 40):
        tree = optimal_tree(PROFILE, budget)
        assert len(tree) == budget  # every node is worth something here, so the whole budget is used
        assert static(tree).budget == budget  # a valid static tree: parents and earlier ranks present
    assert max(len(c) for c in optimal_tree(PROFILE, 30, max_depth=3)) == 3
    assert all(c[-1] == 0 for c in optimal_tree(PROFILE, 10, max_rank=1))
    assert optimal_tree([[0.5, 0.0, 0.0]], 10, max_depth=2) == [(0,), (0, 0)]  # worthless nodes are left out


def closed_trees(budget: int, ranks: int, depth: int):
    """Every tree of exactly `budget` nodes whose ranks are used in order (brute force, for small sizes)."""
    frontier = {frozenset()}
    for _ in range(budget):
        grown = set()
        for tree in frontier:
            parents = [()] + [c for c in tree if len(c) < depth]
            for parent in parents:
                used = sum(1 for c in tree if c[:-1] == parent and len(c) == len(parent) + 1)
                if used < ranks:
                    grown.add(tree | {parent + (used,)})
        frontier = grown
    return frontier


def test_the_dynamic_program_matches_brute_force_on_random_profiles():
    rng = random.Random(0)
    for _ in range(12):
        rows = [[rng.random() * (0.9 ** r) for r in range(3)] for _ in range(rng.randint(1, 3))]
        for budget in (3, 5):
            best = max(expected_accepted_length(sorted(t, key=lambda c: (len(c), c)), rows)
                       for t in closed_trees(budget, ranks=3, depth=budget))
            tree = optimal_tree(rows, budget)
            assert expected_accepted_length(tree, rows) == pytest.approx(best, abs=1e-12)


def test_saved_trees_load_as_static_tree_specs(tmp_path):
    tree = optimal_tree(PROFILE, 6)
    path = save_tree(tree, tmp_path / "trees" / "best.json", PROFILE, meta={"note": "test"})
    spec = parse_tree_spec(f"static:{path}")
    assert spec.kind is TreeKind.STATIC and list(spec.choices) == tree and spec.budget == 6
    data = json.loads(path.read_text())
    assert data["expected_accepted"] == pytest.approx(1.59) and data["expected_tau"] == pytest.approx(2.59)
    assert data["profile"] == PROFILE and data["note"] == "test"


def test_a_profile_from_measured_counts_drops_rarely_seen_cells():
    stats = AcceptanceStats(rank_offered=[[100, 100, 4], [50, 9]], rank_accepted=[[60, 20, 3], [30, 5]])
    profile = AcceptanceProfile.of(stats, min_offered=10)
    assert profile.rows == ((0.6, 0.2, 0.0), (0.6, 0.0))
    assert AcceptanceProfile.of(stats, min_offered=1).rows[0][2] == 0.75
    with pytest.raises(ConfigError, match="offered"):
        AcceptanceProfile.of(AcceptanceStats(rank_offered=[[3]], rank_accepted=[[1]]), min_offered=10)


@pytest.mark.parametrize("bad", [[[1.2]], [[-0.1]], [[float("nan")]], []])
def test_invalid_profiles_are_config_errors(bad):
    with pytest.raises(ConfigError):
        optimal_tree(bad, 4)


def test_a_bad_budget_is_a_config_error():
    with pytest.raises(ConfigError, match="budget"):
        optimal_tree(PROFILE, 0)
