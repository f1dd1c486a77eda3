"""bench/hybrid_pool.py scores a step's pool and verified tree against the continuation that followed."""

from __future__ import annotations

from types import SimpleNamespace

from bench.hybrid_pool import Step, followed, summarize
from specdec.drafters.hybrid_merge import MergedTree


def tree(tokens: list[int], parents: list[int], sources: list[int]) -> MergedTree:
    depths = [0]
    for parent in parents[1:]:
        depths.append(depths[parent] + 1)
    return MergedTree(tokens, parents, depths, sources, [0.0] * len(tokens), [1.0] * len(tokens))


# Root 9; a chain 1 -> 2 -> 3 from part 0 (suffix), siblings 4 and 5 at depth 1 from part 1 (eagle); the first
# node is proposed by both.
POOL = tree([9, 1, 2, 3, 4, 5], [-1, 0, 1, 2, 0, 0], [0, 3, 1, 1, 2, 2])


def test_followed_walks_the_longest_matching_path():
    assert followed(POOL, [1, 2, 3, 7]) == [1, 2, 3]
    assert followed(POOL, [1, 2, 8]) == [1, 2]
    assert followed(POOL, [5, 1]) == [5]
    assert followed(POOL, [6]) == []


def test_summarize_compares_the_verified_tree_with_the_best_choice_from_its_pool():
    seq = SimpleNamespace(prompt_ids=[7, 9], output_ids=[1, 2, 3, 0])
    # The step verified the first node and the two eagle siblings (3 nodes): the continuation 1, 2, 3 follows
    # one of them; the pool holds the whole chain.
    step = Step(seq, 2, POOL, POOL, verified=[1, 4, 5], accepted=[1])
    totals, kinds = summarize([step], [1, 2, 3], ["suffix", "eagle"])
    assert totals["steps"] == 1 and totals["verified"] == 1 and totals["pool"] == 3
    assert [totals[f"best{b}"] for b in (1, 2, 3)] == [1, 2, 3]
    assert totals["verified_nodes"] == 3 and totals["pool_nodes"] == 5
    assert kinds == {"suffix+eagle, depth 1": [1, 1], "eagle, depth 1": [2, 0]}


def test_summarize_skips_a_step_the_engine_did_not_verify():
    seq = SimpleNamespace(prompt_ids=[9], output_ids=[1])
    totals, kinds = summarize([Step(seq, 1, POOL, POOL)], [4], ["suffix", "eagle"])
    assert totals["steps"] == 0 and kinds == {}
