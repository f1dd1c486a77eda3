"""The one tree builder: TreeGrowth from per-node candidates (chain, static, dynamic), trees from per-depth
candidates (choice layouts, best-first), tries of candidate paths, and subtrees.

Hand-made candidates name each node by its rank path: the child of rank r under token t is token `10 * t + r + 1`
(the root is 0), so a drafted token says where in the tree it must sit and which token is its parent.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from specdec.tree.growth import (
    TreeGrowth,
    best_first_tree,
    choice_layout,
    per_depth_trees,
    subtree,
    trie_tree,
)
from specdec.tree.spec import TreeSpec, chain, dynamic, static
from specdec.tree.token_tree import TokenTree

ROOT = 0


def child(token: int, rank: int) -> int:
    return 10 * token + rank + 1


def rank_path(token: int) -> tuple[int, ...]:
    digits = []
    while token:
        digits.append(token % 10 - 1)
        token //= 10
    return tuple(reversed(digits))


def candidates(token: int, width: int, seed: int) -> tuple[list[float], list[int]]:
    """A node's `width` best children, best first: log-probs (< 0, distinct) and tokens."""
    rng = random.Random(token * 7919 + seed)
    logp = sorted((-rng.expovariate(1.0) for _ in range(width)), reverse=True)
    return logp, [child(token, r) for r in range(width)]


def grow(spec: TreeSpec, width: int, seed: int = 0, table=candidates) -> tuple[TokenTree, int]:
    """Drive a TreeGrowth as a drafter does: each frontier node offers `width` candidates per expansion.
    Returns the tree and how many expansions (draft forwards) it took."""
    growth = TreeGrowth(ROOT, spec)
    expansions = 0
    while not growth.done:
        rows = [table(growth.tokens[node], width, seed) for node in growth.frontier]
        growth.expand(torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]))
        expansions += 1
    return growth.tree(), expansions


def assert_consistent(tree: TokenTree) -> None:
    """Every node sits under the parent its token names (so no node lost its parent)."""
    tokens = tree.token_list
    assert tokens[0] == ROOT
    for i, p in enumerate(tree.parent_list[1:], start=1):
        assert tokens[p] == tokens[i] // 10


def reference_dynamic(depth: int, topk: int, budget: int, width: int, seed: int) -> set[int]:
    """EAGLE-2 by the book, to full depth: each depth keeps the `topk` best children (by cumulative log-prob) of
    the previous depth's kept nodes; the tree is the `budget` best nodes ever kept."""
    frontier, kept = [(0.0, ROOT)], []
    for _ in range(depth):
        children = []
        for score, token in frontier:
            logp, tokens = candidates(token, width, seed)
            children += [(score + lp, t) for lp, t in zip(logp[:topk], tokens[:topk])]
        frontier = sorted(children, reverse=True)[:topk]
        kept += frontier
    return {t for _, t in sorted(kept, reverse=True)[:budget]}


# --------------------------------------------------------------------------------------- per-node growth
def test_chain_growth_follows_the_best_candidate_for_k_depths():
    tree, expansions = grow(chain(3), width=4)
    assert tree.is_chain
    assert tree.token_list == [ROOT, 1, 11, 111]
    assert expansions == 3


def test_static_growth_keeps_exactly_the_named_rank_paths():
    choices = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    tree, expansions = grow(static(choices), width=3)
    assert_consistent(tree)
    assert sorted(rank_path(t) for t in tree.token_list[1:]) == sorted(choices)
    assert expansions == 3


def test_static_growth_drops_paths_past_the_offered_candidates():
    tree, _ = grow(static([(0,), (1,), (2,), (2, 0)]), width=2)  # only two candidates per node: no rank 2
    assert sorted(rank_path(t) for t in tree.token_list[1:]) == [(0,), (1,)]


@pytest.mark.parametrize("seed", range(12))
def test_dynamic_growth_equals_eagle2_by_the_book(seed):
    rng = random.Random(seed)
    depth, topk, budget = rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 12)
    width = topk  # a drafter offers topk candidates per node
    tree, expansions = grow(dynamic(depth, topk, budget), width, seed)
    assert_consistent(tree)
    assert set(tree.token_list[1:]) == reference_dynamic(depth, topk, budget, width, seed)
    assert len(tree) - 1 == min(budget, depth * topk)
    assert int(tree.depth.max()) <= depth and expansions <= depth


def test_dynamic_growth_stops_early_when_no_deeper_node_can_make_the_cut():
    def steep(token: int, width: int, seed: int):  # near-certain first depth, unlikely beyond
        return ([-0.01 * (r + 1) for r in range(width)] if token == ROOT else [-5.0 - r for r in range(width)],
                [child(token, r) for r in range(width)])

    tree, expansions = grow(dynamic(depth=6, topk=3, budget=3), width=3, table=steep)
    assert expansions == 2  # depth 2 already scores below the three depth-1 nodes: depths 3..6 are skipped
    assert sorted(tree.token_list[1:]) == [1, 2, 3]


def test_dynamic_growth_early_stop_is_exercised_by_random_cases():
    stopped = 0
    for seed in range(40):
        tree, expansions = grow(dynamic(5, 2, 3), width=2, seed=seed)
        assert set(tree.token_list[1:]) == reference_dynamic(5, 2, 3, 2, seed)
        stopped += expansions < 5
    assert stopped > 0


@pytest.mark.parametrize("spec", [dynamic(3, 2, 4), dynamic(4, 3, 6), static([(0,), (1,), (0, 0), (0, 1)])],
                         ids=["dynamic-4", "dynamic-6", "static"])
def test_scored_tree_gives_each_kept_node_its_own_candidate_probability(spec):
    """The raw score a hybrid calibrates: a node's probability given its parent, exp of its own log-prob."""
    growth = TreeGrowth(ROOT, spec)
    while not growth.done:
        rows = [candidates(growth.tokens[node], 3, 1) for node in growth.frontier]
        growth.expand(torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]))
    tree, probs = growth.scored_tree()
    assert tree.token_list == growth.tree().token_list and tree.parent_list == growth.tree().parent_list
    assert len(probs) == len(tree) and probs[0] == 0.0
    tokens = tree.token_list
    for i, p in enumerate(tree.parent_list[1:], start=1):
        logp, kids = candidates(tokens[p], 3, 1)
        assert probs[i] == pytest.approx(math.exp(logp[kids.index(tokens[i])]))


def test_partial_tree_holds_every_node_so_far_and_the_frontier_is_newest():
    growth = TreeGrowth(ROOT, dynamic(depth=3, topk=2, budget=10))
    logp, tokens = candidates(ROOT, 2, 0)
    growth.expand(torch.tensor([logp]), torch.tensor([tokens]))
    assert growth.partial().token_list == [ROOT, 1, 2] and growth.frontier == [1, 2] and growth.size == 2
    assert not growth.done


def test_depth_zero_is_done_at_once():
    growth = TreeGrowth(ROOT, chain(0))
    assert growth.done and growth.tree().token_list == [ROOT]


# ------------------------------------------------------------------------------------ per-depth candidates
def score_of(ranks: tuple[int, ...], values: list[list[float]]) -> float:
    return sum(values[d][r] for d, r in enumerate(ranks))


def best_tree_by_brute_force(values: list[list[float]], budget: int) -> tuple[float, set[tuple[int, ...]]]:
    """The prefix-closed set of `budget` rank paths with the most expected accepted tokens
    (sum over nodes of exp(path score)), trying every set."""
    depth, width = len(values), len(values[0])
    nodes = [p for d in range(1, depth + 1) for p in itertools.product(range(width), repeat=d)]
    best, best_set = -1.0, set()
    for subset in itertools.combinations(nodes, budget):
        chosen = set(subset)
        if all(len(p) == 1 or p[:-1] in chosen for p in chosen):
            value = sum(math.exp(score_of(p, values)) for p in chosen)
            if value > best:
                best, best_set = value, chosen
    return best, best_set


def ranks_of_tree(tree: TokenTree) -> set[tuple[int, ...]]:
    """Rank paths of a best-first tree whose token at depth d, rank r is 100 * (d + 1) + r."""
    out = set()
    for i in range(1, len(tree)):
        path, node = [], i
        while node:
            path.append(tree.token_list[node] % 100)
            node = tree.parent_list[node]
        out.add(tuple(reversed(path)))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_best_first_tree_is_optimal_when_depths_are_independent(seed):
    rng = random.Random(seed)
    depth, width = rng.choice([(3, 2), (2, 3), (2, 4), (4, 1), (1, 4)])
    budget = rng.randint(1, min(6, sum(width ** d for d in range(1, depth + 1))))
    values = [sorted((-rng.expovariate(1.0) for _ in range(width)), reverse=True) for _ in range(depth)]
    tokens = [[100 * (d + 1) + r for r in range(width)] for d in range(depth)]
    tree = best_first_tree(7, values, tokens, budget)
    assert len(tree) - 1 == budget and tree.token_list[0] == 7
    for i, p in enumerate(tree.parent_list[1:], start=1):  # depth d's candidates sit at depth d
        assert tree.token_list[i] // 100 == int(tree.depth[i])
    got = ranks_of_tree(tree)
    optimum, optimal_set = best_tree_by_brute_force(values, budget)
    assert got == optimal_set
    assert math.isclose(sum(math.exp(score_of(p, values)) for p in got), optimum)


def logp_table(batch: int, depth: int, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(batch, depth, vocab, generator=gen) * 2, dim=-1)


def test_per_depth_static_trees_take_each_depths_ranked_candidates():
    choices = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    logp = logp_table(2, 3, 20, seed=1)
    trees = per_depth_trees([5, 6], logp, static(choices))
    layout = choice_layout(tuple(sorted(choices, key=lambda c: (len(c), c))), 3, 20)
    for b, tree in enumerate(trees):
        ranked = logp[b].argsort(dim=-1, descending=True)  # [D, V]
        want = [int(ranked[len(c) - 1, c[-1]]) for c in sorted(choices, key=lambda c: (len(c), c))]
        assert tree.token_list == [[5, 6][b]] + want
        assert tree.parent_list == layout.parents


def test_per_depth_chain_is_the_argmax_of_each_depth_up_to_the_heads_it_has():
    logp = logp_table(1, 3, 20, seed=2)
    (tree,) = per_depth_trees([4], logp, chain(5))  # only three depths of candidates
    assert tree.is_chain and tree.token_list == [4] + logp[0].argmax(-1).tolist()


@pytest.mark.parametrize("spec", [static([(0,), (1,), (0, 0), (1, 0)]), chain(3), dynamic(depth=3, topk=3, budget=6)],
                         ids=["static", "chain", "dynamic"])
def test_per_depth_trees_over_a_reduced_vocabulary_equal_ranking_the_scattered_full_one(spec):
    vocab, ids = 40, torch.tensor([2, 3, 7, 11, 19, 23, 31])
    reduced = logp_table(2, 3, len(ids), seed=4)
    full = reduced.new_full((2, 3, vocab), float("-inf")).index_copy_(-1, ids, reduced)
    mapped = per_depth_trees([1, 2], reduced, spec, ids)
    for got, want in zip(mapped, per_depth_trees([1, 2], full, spec)):
        assert got.token_list == want.token_list and got.parent_list == want.parent_list
        assert set(got.token_list[1:]) <= set(ids.tolist())


def test_per_depth_dynamic_trees_are_best_first_over_the_topk():
    logp = logp_table(2, 4, 30, seed=3)
    spec = dynamic(depth=3, topk=4, budget=9)
    trees = per_depth_trees([1, 2], logp, spec)
    for b, tree in enumerate(trees):
        top = logp[b, :3].topk(4, dim=-1)
        want = best_first_tree([1, 2][b], top.values.tolist(), top.indices.tolist(), 9)
        assert tree.token_list == want.token_list and tree.parent_list == want.parent_list
        assert len(tree) == 10 and int(tree.depth.max()) <= 3


def test_per_depth_trees_of_nothing_are_the_root():
    logp = logp_table(1, 2, 10, seed=4)
    assert per_depth_trees([3], logp, chain(0))[0].token_list == [3]
    assert per_depth_trees([3], logp[:, :0], chain(4))[0].token_list == [3]


def test_choice_layout_drops_paths_too_deep_or_too_wide_with_their_subtrees():
    choices = ((0,), (1,), (2,), (0, 0), (0, 1), (2, 0), (0, 0, 0))
    layout = choice_layout(choices, max_depth=2, width=2)
    # kept: (0,), (1,), (0, 0), (0, 1); (2,) ranks past the width (and takes (2, 0) with it), (0, 0, 0) is too deep
    assert layout.parents == [-1, 0, 0, 1, 1]
    assert layout.depths.tolist() == [0, 0, 1, 1]
    assert layout.ranks.tolist() == [0, 1, 0, 1]


# ------------------------------------------------------------------------------------------ candidate paths
def test_trie_counts_shared_prefixes_once_and_stops_at_the_budget():
    tree = trie_tree(9, [[1, 2, 3], [1, 2], [1, 4, 5], [6]], budget=5)
    assert tree.token_list == [9, 1, 2, 3, 4, 5]  # [1, 2] adds nothing; [6] is past the budget
    assert tree.parent_list == [-1, 0, 1, 2, 1, 4]
    cut = trie_tree(9, [[1, 2, 3], [1, 4, 5]], budget=4)
    assert cut.token_list == [9, 1, 2, 3, 4]  # the second path is cut after its first new node


# ------------------------------------------------------------------------------------------------- subtree
def test_subtree_keeps_nodes_whose_ancestors_are_kept_and_reindexes_parents():
    tokens, parents = [0, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 3, 2]
    tree = subtree(tokens, parents, [0, 1, 2, 4, 5])  # 4's parent 3 is not kept: 4 goes too
    assert tree.token_list == [0, 1, 2, 5]
    assert tree.parent_list == [-1, 0, 0, 2]

