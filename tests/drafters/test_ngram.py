"""Prompt-lookup drafting: the longest suffix n-gram is looked up in the text so far, and what followed its most
recent occurrences becomes the draft (one chain, or several branches merged into a trie)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.base import DrafterContext
from specdec.drafters.ngram import NgramDrafter, find_continuations
from specdec.tree.growth import trie_tree
from specdec.drafters.registry import build_drafter
from specdec.errors import ConfigError
from specdec.engine.sequence import Sequence
from specdec.tree.spec import chain, dynamic


def continuations(tokens: list[int], n: int, length: int, branches: int) -> list[list[int]]:
    return find_continuations(np.asarray(tokens, dtype=np.int64), n, length, branches)


def make_sequence(prompt: list[int], output: list[int] = ()) -> Sequence:
    return Sequence(seq_id=0, prompt_ids=list(prompt), params=SamplingParams(max_new_tokens=16),
                    generator=torch.Generator().manual_seed(0), output_ids=list(output))


def test_most_recent_occurrence_comes_first():
    #          [1 2 3] 9 5 [1 2 3] 7 5 . [1 2 3]
    tokens = [1, 2, 3, 9, 5, 1, 2, 3, 7, 5, 1, 2, 3]
    assert continuations(tokens, n=3, length=2, branches=1) == [[7, 5]]
    assert continuations(tokens, n=3, length=2, branches=2) == [[7, 5], [9, 5]]


def test_continuation_stops_at_the_requested_length_or_the_end_of_the_text():
    tokens = [4, 5, 6, 7, 8, 4, 5]
    assert continuations(tokens, n=2, length=3, branches=1) == [[6, 7, 8]]
    assert continuations(tokens, n=2, length=10, branches=1) == [[6, 7, 8, 4, 5]]


def test_the_suffix_never_matches_itself():
    assert continuations([1, 2, 3, 4], n=2, length=4, branches=4) == []
    assert continuations([7], n=3, length=4, branches=1) == []


def test_falls_back_to_shorter_ngrams_when_the_longest_has_no_match():
    # [0 4 5] never occurred before, [4 5] did
    assert continuations([3, 4, 5, 6, 0, 4, 5], n=3, length=2, branches=1) == [[6, 0]]
    # nothing longer than the last token itself occurred before
    assert continuations([7, 1, 2, 9, 8, 5, 2], n=3, length=2, branches=1) == [[9, 8]]


def test_a_longer_match_wins_over_a_more_recent_shorter_one():
    # the trigram [1 2 3] matched at 0; the bigram [2 3] also matched, more recently, at 5
    tokens = [1, 2, 3, 8, 9, 2, 3, 7, 1, 2, 3]
    assert continuations(tokens, n=3, length=2, branches=1) == [[8, 9]]
    # and shorter matches are not mixed in to fill up the branches
    assert continuations(tokens, n=3, length=2, branches=3) == [[8, 9]]


def test_identical_continuations_are_returned_once():
    tokens = [1, 2, 5, 1, 2, 5, 1, 2]
    assert continuations(tokens, n=2, length=1, branches=3) == [[5]]


def test_returns_at_most_branches_distinct_continuations():
    tokens = [1, 10, 1, 11, 1, 12, 1, 13, 1]
    assert continuations(tokens, n=1, length=1, branches=2) == [[13], [12]]
    assert continuations(tokens, n=1, length=1, branches=10) == [[13], [12], [11], [10]]


def test_zero_length_asks_for_nothing():
    assert continuations([1, 2, 1, 2], n=2, length=0, branches=2) == []


def test_trie_merges_shared_prefixes_into_one_branch():
    tree = trie_tree(9, [[1, 2, 3], [1, 2, 4], [5]], budget=10)
    assert tree.tokens.tolist() == [9, 1, 2, 3, 4, 5]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 2, 0]
    assert tree.paths == [[0, 1, 2, 3], [0, 1, 2, 4], [0, 5]]


@pytest.mark.parametrize("budget, tokens, parents", [
    (4, [9, 1, 2, 3, 4], [-1, 0, 1, 2, 2]),
    (3, [9, 1, 2, 3], [-1, 0, 1, 2]),
    (1, [9, 1], [-1, 0]),
    (0, [9], [-1]),
])
def test_trie_keeps_earlier_continuations_first_within_the_budget(budget, tokens, parents):
    tree = trie_tree(9, [[1, 2, 3], [1, 2, 4], [5]], budget=budget)
    assert tree.tokens.tolist() == tokens
    assert tree.parents.tolist() == parents
    assert len(tree) - 1 <= budget


def test_trie_of_no_continuations_is_the_root_alone():
    tree = trie_tree(4, [], budget=8)
    assert tree.tokens.tolist() == [4] and tree.parents.tolist() == [-1]


def test_drafter_proposes_the_chain_that_followed_the_last_trigram():
    seq = make_sequence([10, 11, 12, 13, 14, 15, 10, 11], output=[12])
    (tree,) = NgramDrafter(n=3, k=3).propose([seq], chain(3))
    assert tree.is_chain
    assert tree.tokens.tolist() == [12, 13, 14, 15]  # the root is the last token


def test_drafter_chain_is_cut_to_the_spec_depth():
    seq = make_sequence([1, 2, 3, 4, 5, 6, 7, 1, 2])
    (tree,) = NgramDrafter(n=2, k=8).propose([seq], chain(2))
    assert tree.tokens.tolist() == [2, 3, 4]


def test_drafter_proposes_the_root_alone_when_nothing_matches():
    (tree,) = NgramDrafter().propose([make_sequence([1, 2, 3, 4])], chain(5))
    assert tree.tokens.tolist() == [4]


def test_drafter_makes_one_tree_per_sequence():
    seqs = [make_sequence([5, 6, 7, 5, 6]), make_sequence([1, 2, 1])]
    trees = NgramDrafter(n=2, k=2).propose(seqs, chain(2))
    assert [t.tokens.tolist() for t in trees] == [[6, 7, 5], [1, 2, 1]]


def test_drafter_with_branches_proposes_a_trie_of_recent_matches():
    seq = make_sequence([3, 1, 2, 3, 4, 5, 3, 4, 6, 3, 4])
    drafter = NgramDrafter(n=2, k=2, branches=2)
    spec = drafter.default_tree()
    assert spec == dynamic(depth=2, topk=2, budget=4)
    (tree,) = drafter.propose([seq], spec)
    # [3 4] was followed by 6 3 (most recent), then by 5 3
    assert tree.tokens.tolist() == [4, 6, 3, 5, 3]
    assert tree.parents.tolist() == [-1, 0, 1, 0, 3]


def test_single_branch_drafter_defaults_to_a_chain_of_k():
    assert NgramDrafter(k=6).default_tree() == chain(6)


def test_ngram_spec_string_builds_the_drafter():
    ctx = DrafterContext(target=None, engine=EngineConfig(), device=torch.device("cpu"), dtype=torch.float32,
                         quantize=None)
    drafter = build_drafter("ngram:n=2,k=4,branches=3", ctx)
    assert isinstance(drafter, NgramDrafter)
    assert (drafter.n, drafter.k, drafter.branches) == (2, 4, 3)
    with pytest.raises(ConfigError, match="unknown option.*width"):
        build_drafter("ngram:width=2", ctx)
    with pytest.raises(ConfigError, match="n must be >= 1"):
        build_drafter("ngram:n=0", ctx)
