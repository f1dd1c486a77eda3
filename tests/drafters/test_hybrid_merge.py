"""Merging several drafters' scored trees under one budget, and the online calibration behind it."""

from __future__ import annotations

import random

import pytest

from specdec.drafters.calibration import AcceptanceCalibration, score_bin
from specdec.drafters.hybrid_merge import ScoredTree, merge_trees, observe_verification


def random_tree(rng: random.Random, root: int, n: int, vocab: int = 4) -> ScoredTree:
    tokens, parents, scores = [root], [-1], [0.0]
    used: set[tuple[int, int]] = set()
    while len(tokens) < n:
        parent = rng.randrange(len(tokens))
        token = rng.randrange(vocab)
        if (parent, token) in used:
            continue
        used.add((parent, token))
        tokens.append(token)
        parents.append(parent)
        scores.append(rng.random())
    return ScoredTree(tokens, parents, scores)


def paths_of(tokens: list[int], parents: list[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for i in range(1, len(tokens)):
        out.append(out[parents[i]] + (tokens[i],))
    return out


def union_path_probs(proposals: list[ScoredTree], calib: AcceptanceCalibration, max_depth: int) -> dict:
    """Reference: every distinct path of the union, with its path probability computed independently."""
    raw: dict[tuple[int, ...], dict[int, float]] = {}
    for i, tree in enumerate(proposals):
        for path, score in zip(paths_of(tree.tokens, tree.parents)[1:], tree.scores[1:]):
            entry = raw.setdefault(path, {})
            entry[1 << i] = max(entry.get(1 << i, 0.0), score)

    def cond(path):
        proposers = raw[path]
        mask, best = sum(proposers), max(proposers.values())
        if len(proposers) == 1:
            return calib.estimate(mask, len(path), best)
        prior = max(calib.estimate(b, len(path), r) for b, r in proposers.items())
        return calib.estimate(mask, len(path), best, prior=prior)

    probs = {}
    for path in sorted(raw, key=len):
        if len(path) <= max_depth:
            probs[path] = (probs[path[:-1]] if len(path) > 1 else 1.0) * cond(path)
    return probs


@pytest.mark.parametrize("seed", range(8))
def test_merged_tree_keeps_the_most_probable_union_paths_within_budget(seed):
    rng = random.Random(seed)
    proposals = [random_tree(rng, 7, rng.randint(1, 14)) for _ in range(rng.randint(1, 3))]
    calib = AcceptanceCalibration()
    for _ in range(200):  # some evidence, so estimates differ from raw scores
        calib.observe(rng.choice([1, 2, 3]), rng.randint(1, 4), rng.random(), rng.random() < 0.3)
    budget, max_depth = rng.randint(1, 12), rng.randint(1, 5)
    merged = merge_trees(proposals, calib, budget, max_depth)
    paths = paths_of(merged.tokens, merged.parents)
    assert len(merged.tokens) - 1 <= budget
    assert len(set(paths)) == len(paths), "the merged tree holds a path twice"
    assert all(p < i for i, p in enumerate(merged.parents) if i), "parents must come first"
    assert max(merged.depths) <= max_depth and merged.depths == [len(p) for p in paths]
    expected = union_path_probs(proposals, calib, max_depth)
    for path, prob in zip(paths[1:], merged.probs[1:]):
        assert prob == pytest.approx(expected[path])
    kept = set(paths[1:])
    want = sorted(expected.values(), reverse=True)[:budget]
    assert sorted(merged.probs[1:], reverse=True) == pytest.approx(want)
    assert len(kept) == min(budget, len(expected))


def test_shared_prefixes_are_counted_once_and_remember_both_proposers():
    a = ScoredTree([5, 1, 2, 3], [-1, 0, 1, 2], [0, 0.9, 0.8, 0.7])
    b = ScoredTree([5, 1, 2, 4], [-1, 0, 1, 2], [0, 0.5, 0.5, 0.5])
    merged = merge_trees([a, b], AcceptanceCalibration(), budget=10, max_depth=8)
    assert merged.tokens == [5, 1, 2, 3, 4]
    assert merged.sources == [0, 3, 3, 1, 2]
    assert merged.raw[1] == 0.9  # the best proposer's score decides the bin


def test_calibration_moves_toward_observed_acceptance():
    calib = AcceptanceCalibration(prior_weight=8.0)
    claimed, true_rate = 0.9, 0.2
    before = calib.estimate(1, 1, claimed)
    assert before == pytest.approx(claimed)
    rng = random.Random(0)
    gaps = []
    for _ in range(5):
        for _ in range(40):
            calib.observe(1, 1, claimed, rng.random() < true_rate)
        gaps.append(abs(calib.estimate(1, 1, claimed) - true_rate))
    assert gaps[-1] < 0.08 < abs(before - true_rate) / 5
    assert calib.estimate(2, 1, claimed) == pytest.approx(claimed), "another drafter's evidence leaked"
    assert calib.estimate(1, 2, claimed) == pytest.approx(claimed), "another depth's evidence leaked"


def test_observe_counts_only_the_nodes_the_verifier_tried():
    tree = ScoredTree([9, 1, 2, 3, 4], [-1, 0, 0, 1, 2], [0, 0.6, 0.6, 0.6, 0.6])
    calib = AcceptanceCalibration()
    merged = merge_trees([tree], calib, budget=10, max_depth=4)
    accepted = [0, merged.tokens.index(1)]  # root, then the node with token 1; its child was tried, not taken
    observe_verification(merged, accepted, calib)
    assert calib.observed(1, 1, 0.6) == (2.0, 1.0)  # both depth-1 nodes tried, one accepted
    assert calib.observed(1, 2, 0.6) == (1.0, 0.0)  # only the child of the accepted node was tried


def test_score_bins_separate_small_probabilities():
    assert [score_bin(x) for x in (1.0, 0.7, 0.5, 0.35, 0.25)] == [0, 1, 2, 3, 4]
    assert score_bin(0.0) == score_bin(1e-9)


def test_optimism_rates_unproven_kinds_up_until_they_are_tried():
    from specdec.drafters.calibration import AcceptanceCalibration

    plain, hopeful = AcceptanceCalibration(), AcceptanceCalibration(optimism=1.0)
    assert hopeful.estimate(1, 3, 0.5) > plain.estimate(1, 3, 0.5) == 0.5
    for _ in range(400):
        for cal in (plain, hopeful):
            cal.observe(1, 3, 0.5, accepted=True)
    assert plain.estimate(1, 3, 0.5) > 0.97
    assert hopeful.estimate(1, 3, 0.5) - plain.estimate(1, 3, 0.5) < 0.01  # evidence leaves little room
