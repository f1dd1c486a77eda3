"""The corpus suffix array against the suffix trie (the plain reference): the same matches, counts and drafts
on random corpora with small alphabets (so patterns repeat), and a draft deeper than the match where the trie's
depth would stop it; range sampling still finds the dominant continuation."""

from __future__ import annotations

import random

import pytest

from specdec.drafters import suffix_array
from specdec.drafters.suffix_array import CorpusSuffixArray
from specdec.drafters.suffix_index import SuffixTrie
from specdec.errors import ConfigError
from tests.drafters.test_suffix_index import assert_counts_are_naive, random_seqs

MATCH = 6  # the array's longest match
DRAFT = 5  # the deepest draft asked for; the reference trie is deep enough never to cut one short


def reference_trie(seqs: list[list[int]]) -> SuffixTrie:
    trie = SuffixTrie(MATCH + DRAFT + 1)
    for i, s in enumerate(seqs):
        trie.extend(i, s)
        trie.close(i)
    return trie


@pytest.mark.parametrize("gather_max", [0, 256])
@pytest.mark.parametrize("seed", range(6))
def test_counts_equal_naive_counting(seed, gather_max, monkeypatch):
    monkeypatch.setattr(suffix_array, "GATHER_MAX", gather_max)
    rng = random.Random(900 + seed)
    seqs = random_seqs(rng, 7, alphabet=rng.choice([2, 3, 5]))
    array = CorpusSuffixArray.build(seqs, MATCH)
    assert array.num_tokens == sum(map(len, seqs))
    assert_counts_are_naive(array.count, seqs, rng, MATCH, 200)


@pytest.mark.parametrize("small_count", [0, 32])  # continuations counted by np.unique, or in Python when few
@pytest.mark.parametrize("gather_max", [0, 256])  # ranges searched by bisection, or by gather + searchsorted
@pytest.mark.parametrize("seed", range(8))
def test_drafts_equal_the_tries_drafts(seed, gather_max, small_count, monkeypatch):
    """Same tokens, parents, probabilities, support and match length, for chains and branching trees; the
    trie sees the context's last MATCH tokens, so both consider the same match lengths."""
    monkeypatch.setattr(suffix_array, "GATHER_MAX", gather_max)
    monkeypatch.setattr(suffix_array, "SMALL_COUNT", small_count)
    rng = random.Random(1000 + seed)
    alphabet = rng.choice([3, 5, 8])
    seqs = random_seqs(rng, 8, alphabet=alphabet, low=20, high=120)
    array, trie = CorpusSuffixArray.build(seqs, MATCH, sample=10 ** 6), reference_trie(seqs)
    for _ in range(60):
        context = seqs[rng.randrange(len(seqs))][: rng.randint(1, 60)] + [rng.randrange(alphabet + 1)]
        args = (rng.randint(1, 10), rng.randint(1, DRAFT), rng.choice([0.5, 1.0, 3.0]), rng.choice([0.0, 1.0]),
                rng.choice([0.0, 0.1, 0.3]), rng.choice([0, 1, 2]))
        a, b = array.speculate(context, *args), trie.speculate(context[-MATCH:], *args)
        assert (a.tokens, a.parents, a.support, a.match_len) == (b.tokens, b.parents, b.support, b.match_len), args
        assert a.probs == pytest.approx(b.probs, abs=1e-12)


def test_matches_never_cross_from_one_answer_into_the_next():
    array = CorpusSuffixArray.build([[1, 2], [3, 4, 5]], MATCH)
    assert array.count([2, 3]) == 0 and array.count([3, 4]) == 1
    assert array.speculate([9, 1, 2], 4, 4, min_prob=0.0).tokens == []  # the answer ended after "1 2"
    assert array.speculate([2, 3], 4, 4, factor=2.0, min_prob=0.0).tokens == [4, 5]  # "3" matched; "2 3" never occurred


def test_a_long_match_drafts_deeper_than_the_match_depth():
    answer = list(range(1, 31))
    array = CorpusSuffixArray.build([answer], match_depth=4)
    draft = array.speculate(answer[:10], max_tokens=12, max_depth=12, factor=3.0)
    assert draft.match_len == 4 and draft.tokens == answer[10:22]


def test_a_sampled_range_still_drafts_the_dominant_continuation():
    rng = random.Random(5)
    seqs = [[7, 1 if rng.random() < 0.8 else rng.randrange(2, 40)] for _ in range(5000)]
    draft = CorpusSuffixArray.build(seqs, MATCH, sample=64).speculate([7], 1, 1, min_prob=0.0)
    exact = CorpusSuffixArray.build(seqs, MATCH).speculate([7], 1, 1, min_prob=0.0)
    assert draft.tokens == exact.tokens == [1] and draft.support[0] == 64 and abs(draft.probs[0] - 0.8) < 0.15


def test_an_empty_corpus_matches_nothing_and_bad_options_are_refused():
    assert CorpusSuffixArray.build([], MATCH).speculate([1, 2], 4, 4).tokens == []
    with pytest.raises(ConfigError, match="match_depth"):
        CorpusSuffixArray.build([[1]], 0)
