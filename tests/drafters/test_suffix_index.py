"""The suffix trie against naive counting on random token strings (small alphabets, so patterns repeat)."""

from __future__ import annotations

import random

import pytest

from specdec.drafters.suffix_index import GlobalSuffixIndex, SuffixTrie
from specdec.errors import ConfigError


def naive_count(seqs: list[list[int]], pattern: list[int]) -> int:
    m = len(pattern)
    return sum(1 for s in seqs for i in range(len(s) - m + 1) if s[i: i + m] == pattern)


def distinct_substrings(seqs: list[list[int]], max_len: int) -> int:
    return len({tuple(s[i: i + m]) for s in seqs for m in range(1, max_len + 1) for i in range(len(s) - m + 1)})


def random_seqs(rng: random.Random, n: int, alphabet: int, low: int = 5, high: int = 60) -> list[list[int]]:
    return [[rng.randrange(alphabet) for _ in range(rng.randint(low, high))] for _ in range(n)]


def assert_counts_are_naive(count, seqs: list[list[int]], rng: random.Random, max_len: int, trials: int) -> None:
    """`count(pattern)` equals naive counting for patterns drawn from the text (70%) or at random."""
    for _ in range(trials):
        s = rng.choice(seqs)
        m = rng.randint(1, max_len)
        start = rng.randint(0, max(len(s) - m, 0))
        pattern = s[start: start + m] if rng.random() < 0.7 else [rng.randrange(6) for _ in range(m)]
        assert count(pattern) == naive_count(seqs, pattern), pattern


@pytest.mark.parametrize("seed", range(4))
def test_counts_and_nodes_equal_naive_counting(seed):
    rng = random.Random(seed)
    depth = rng.choice([2, 3, 5, 8])
    seqs = random_seqs(rng, 6, alphabet=rng.choice([2, 3, 5]))
    trie = SuffixTrie(depth)
    for i, s in enumerate(seqs):
        cut = rng.randint(0, len(s))  # appended in two pieces: extension must not depend on how it is split
        trie.extend(i, s[:cut])
        trie.extend(i, s[cut:])
    assert_counts_are_naive(trie.count, seqs, rng, depth, 300)
    assert trie.num_nodes == distinct_substrings(seqs, depth)


@pytest.mark.parametrize("seed", range(4))
def test_remove_frees_exactly_the_nodes_no_other_sequence_uses(seed):
    rng = random.Random(100 + seed)
    depth = 6
    seqs = random_seqs(rng, 8, alphabet=3)
    trie = SuffixTrie(depth)
    for i, s in enumerate(seqs):
        trie.extend(i, s)
    alive = dict(enumerate(seqs))
    for victim in rng.sample(range(8), 5):
        trie.remove(victim)
        del alive[victim]
        kept = list(alive.values())
        assert trie.num_nodes == distinct_substrings(kept, depth)
        for s in kept:
            for m in range(1, depth + 1):
                pattern = s[:m]
                assert trie.count(pattern) == naive_count(kept, pattern)
    for victim in list(alive):
        trie.remove(victim)
    assert trie.num_nodes == 0
    trie.extend(99, [1, 2, 1, 2])  # freed nodes are reused correctly
    assert trie.count([1, 2]) == 2 and trie.num_nodes == distinct_substrings([[1, 2, 1, 2]], depth)


@pytest.mark.parametrize("seed", range(4))
def test_matches_are_the_suffixes_that_occur(seed):
    rng = random.Random(200 + seed)
    depth = 7
    seqs = random_seqs(rng, 3, alphabet=3)
    trie = SuffixTrie(depth)
    for i, s in enumerate(seqs):
        trie.extend(i, s)
    for context in [seqs[0], seqs[1][:10], [rng.randrange(4) for _ in range(12)]]:
        expect = []
        for m in range(1, min(len(context), depth - 1) + 1):
            if naive_count(seqs, context[-m:]) == 0:
                break
            expect.append(m)
        assert [m for m, _ in trie.matches(context)] == expect
        for m, node in trie.matches(context):
            assert trie._count[node] == naive_count(seqs, context[-m:])
    # the indexed sequence's own live suffixes give the same answer as walking
    assert trie.matches(seqs[0], seq_id=0) == trie.matches(list(seqs[0]))


def naive_prob(seqs: list[list[int]], pattern: list[int], path: list[int]) -> float:
    """P(path | pattern) from continuation counts: each step, count(next) / sum over next tokens."""
    prob = 1.0
    for i in range(len(path)):
        prefix = pattern + path[:i]
        conts = [s[j + len(prefix)] for s in seqs for j in range(len(s) - len(prefix))
                 if s[j: j + len(prefix)] == prefix]
        if not conts:
            return 0.0
        prob *= conts.count(path[i]) / len(conts)
    return prob


@pytest.mark.parametrize("seed", range(6))
def test_expansion_is_best_first_over_naive_continuation_probabilities(seed):
    rng = random.Random(300 + seed)
    depth = 10
    seqs = random_seqs(rng, 4, alphabet=3, low=30, high=80)
    trie = SuffixTrie(depth)
    for i, s in enumerate(seqs):
        trie.extend(i, s)
    pattern = seqs[0][5:7]
    node = trie._walk(pattern)
    max_tokens, max_depth, min_prob = rng.randint(1, 12), rng.randint(1, 5), rng.choice([0.0, 0.05, 0.2])
    draft = trie.expand(node, max_tokens, max_depth, min_prob)
    paths: list[list[int]] = []
    for token, parent, prob in zip(draft.tokens, draft.parents, draft.probs):
        assert parent < len(paths)
        path = (paths[parent] if parent >= 0 else []) + [token]
        paths.append(path)
        assert prob == pytest.approx(naive_prob(seqs, pattern, path))
        assert prob >= min_prob and len(path) <= max_depth
    assert len({tuple(p) for p in paths}) == len(paths), "a path was drafted twice"
    assert len(paths) <= max_tokens
    # nothing left out beats what was kept: every unexpanded child of the draft (or of the root) is worse than
    # the least probable drafted node, or the draft had room and it was below min_prob / too deep
    frontier = [[]] + paths
    lowest = min(draft.probs) if draft.probs else 1.0
    drafted = {tuple(p) for p in paths}
    for base in frontier:
        if len(base) >= max_depth:
            continue
        for token in range(3):
            cand = base + [token]
            if tuple(cand) in drafted:
                continue
            p = naive_prob(seqs, pattern, cand)
            if p > 0 and p >= min_prob:
                assert len(paths) == max_tokens and p <= lowest + 1e-12, (cand, p, lowest)


def test_speculate_grows_with_the_match_and_respects_limits():
    trie = SuffixTrie(16)
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9] * 3
    trie.extend(0, text)
    long = trie.speculate([9, 1, 2, 3, 4], max_tokens=8, max_depth=8, factor=1.0)
    assert long.match_len == 5 and long.tokens == [5, 6, 7, 8, 9]  # factor 1: at most match_len tokens
    assert long.parents == [-1, 0, 1, 2, 3] and long.probs == [1.0] * 5
    short = trie.speculate([7, 7, 4], max_tokens=8, max_depth=8, factor=1.0)  # only "4" occurs: 1 token
    assert short.match_len == 1 and short.tokens == [5]
    capped = trie.speculate([9, 1, 2, 3, 4], max_tokens=3, max_depth=2, factor=4.0)
    assert capped.tokens == [5, 6]
    assert trie.speculate([42], max_tokens=8, max_depth=8).tokens == []


def test_threshold_and_branching_shape_the_tree():
    trie = SuffixTrie(8)
    # after "1 2": 3 follows three times, 4 twice, 5 once
    for i, nxt in enumerate([3, 3, 3, 4, 4, 5]):
        trie.extend(i, [1, 2, nxt, 0])
    tree = trie.speculate([1, 2], max_tokens=10, max_depth=1, factor=10.0, min_prob=0.0)
    assert tree.tokens == [3, 4, 5] and tree.probs == pytest.approx([0.5, 1 / 3, 1 / 6])
    assert trie.speculate([1, 2], 10, 1, factor=10.0, min_prob=0.2).tokens == [3, 4]
    assert trie.speculate([1, 2], 10, 1, factor=10.0, min_prob=0.0, branching=1).tokens == [3]


def test_global_index_stays_within_its_node_bound_and_keeps_the_newest():
    rng = random.Random(7)
    index = GlobalSuffixIndex(max_depth=8, max_nodes=2_000)
    outputs = random_seqs(rng, 400, alphabet=50, low=20, high=200)
    for out in outputs:
        index.add(out)
        assert index.trie.num_nodes <= index.max_nodes
    kept = outputs[-index.num_requests:]
    assert 1 <= index.num_requests < len(outputs)
    assert index.trie.num_nodes == distinct_substrings(kept, 8)
    newest = outputs[-1]
    assert index.trie.count(newest[:3]) == naive_count(kept, newest[:3])
    huge = [rng.randrange(10_000) for _ in range(5_000)]  # alone bigger than the bound: cut to fit
    index.add(huge)
    assert index.trie.num_nodes <= index.max_nodes


def test_bad_sizes_are_refused():
    with pytest.raises(ConfigError):
        SuffixTrie(1)
    with pytest.raises(ConfigError):
        GlobalSuffixIndex(max_depth=8, max_nodes=4)


def test_a_shorter_match_wins_when_its_continuations_score_higher():
    trie = SuffixTrie(16)
    trie.extend(0, [5, 1, 2, 9])  # the long pattern "5 1 2" continued once, by one token, then stopped
    for i in range(1, 4):
        trie.extend(i, [1, 2, 3, 4, 8])  # "1 2" continued three times with "3 4"
    draft = trie.speculate([7, 5, 1, 2], max_tokens=8, max_depth=8, factor=1.0, min_prob=0.0)
    assert draft.match_len == 2 and draft.tokens[:2] == [3, 4]
