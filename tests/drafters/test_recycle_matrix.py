"""The Token Recycling adjacency matrix against a plain reference loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.drafters.recycle_matrix import UNSEEN, AdjacencyMatrix, template_layout
from specdec.errors import ConfigError
from specdec.kernels import cpu as cpu_kernels


def reference_update(table: np.ndarray, tokens: list[int], logits: torch.Tensor) -> None:
    """One row at a time, each row sorted in full; later nodes overwrite earlier ones."""
    k = table.shape[1]
    for token, row in zip(tokens, logits.tolist()):
        order = sorted(range(len(row)), key=lambda j: -row[j])
        table[token] = order[:k]


@pytest.mark.parametrize("seed", range(5))
def test_update_writes_the_top_k_of_every_node_like_the_reference_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    vocab, k = 50, 6
    matrix = AdjacencyMatrix(vocab, k)
    expect = np.full((vocab, k), UNSEEN, dtype=np.int32)
    for _ in range(4):  # several steps, tokens repeating within and across steps
        n = int(torch.randint(1, 12, (1,), generator=gen))
        tokens = torch.randint(0, 8, (n,), generator=gen)
        logits = torch.randn(n, vocab, generator=gen)
        matrix.update(tokens, logits)
        reference_update(expect, tokens.tolist(), logits)
        np.testing.assert_array_equal(matrix.table, expect)


def reference_expand(table: np.ndarray, root: int, choices) -> list[tuple[tuple[int, ...], int]]:
    """(choice path, token) of every template node whose whole path lies on seen rows."""
    out, token_at = [], {(): root}
    for path in sorted(choices, key=lambda c: (len(c), c)):
        parent = token_at.get(path[:-1])
        if parent is None or path[-1] >= table.shape[1] or table[parent, path[-1]] == UNSEEN:
            continue
        token_at[path] = int(table[parent, path[-1]])
        out.append((path, token_at[path]))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_expand_follows_the_template_and_prunes_unseen_rows(seed):
    rng = np.random.default_rng(seed)
    vocab, k = 30, 4
    matrix = AdjacencyMatrix(vocab, k)
    seen = rng.choice(vocab, size=18, replace=False)  # a warm-ish matrix: some rows never written
    for t in seen:
        matrix.table[t] = rng.choice(vocab, size=k, replace=False)
    choices = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (2, 3), (0, 0, 0, 0), (5,))
    root = int(seen[0])
    tokens, parents = matrix.expand(root, template_layout(choices))
    expect = reference_expand(matrix.table, root, choices)
    assert tokens[0] == root and parents[0] == -1
    assert len(tokens) == 1 + len(expect)
    got_paths = {}
    for i in range(1, len(tokens)):  # recover each node's token path and check against the reference
        got_paths[i] = (got_paths.get(parents[i], ()) if parents[i] > 0 else ()) + (tokens[i],)
    ref_paths = set()
    for path, _ in expect:
        toks, cur = [], ()
        for r in path:
            cur = cur + (r,)
            toks.append(dict(expect)[cur])
        ref_paths.add(tuple(toks))
    assert set(got_paths.values()) == ref_paths
    assert all(0 <= p < i for i, p in enumerate(parents) if i)


def test_a_cold_matrix_drafts_nothing_and_reset_forgets():
    matrix = AdjacencyMatrix(20, 3)
    layout = template_layout(((0,), (1,), (0, 0)))
    assert matrix.expand(4, layout) == ([4], [-1])
    matrix.update(torch.tensor([4]), torch.arange(20, dtype=torch.float32)[None])
    tokens, parents = matrix.expand(4, layout)
    assert tokens == [4, 19, 18] and parents == [-1, 0, 0]  # row 19 unseen: (0, 0) pruned
    assert matrix.nbytes == 20 * 3 * (4 + 4)  # int32 successors and float32 probabilities
    matrix.reset()
    assert matrix.expand(4, layout) == ([4], [-1])


def test_max_depth_cuts_the_template():
    matrix = AdjacencyMatrix(10, 2)
    matrix.table[:] = np.array([[(t + 1) % 10, (t + 2) % 10] for t in range(10)])
    layout = template_layout(((0,), (0, 0), (0, 0, 0)))
    assert matrix.expand(0, layout, max_depth=2) == ([0, 1, 2], [-1, 0, 1])


def test_bad_templates_and_shapes_are_refused():
    with pytest.raises(ConfigError):
        template_layout(((0, 0),))
    with pytest.raises(ConfigError):
        AdjacencyMatrix(10, 2).update(torch.tensor([1]), torch.zeros(1, 9))


def reference_best_first(matrix: AdjacencyMatrix, root: int, budget: int, depth: int, min_prob: float, width: int):
    """Every rank path up to `depth` with its product of stored probabilities; the `budget` best above min_prob."""
    paths = {}
    frontier = [((), root, 1.0)]
    for _ in range(depth):
        nxt = []
        for ranks, token, prob in frontier:
            for r in range(width):
                t, p = int(matrix.table[token, r]), float(matrix.probs[token, r])
                if t < 0 or p <= 0:
                    break
                path_prob = prob * p
                if path_prob < min_prob:
                    break
                key = ranks + (r,)
                paths[key] = path_prob
                nxt.append((key, t, path_prob))
        frontier = nxt
    return sorted(paths.values(), reverse=True)[:budget]


@pytest.mark.parametrize("seed", range(5))
def test_best_first_keeps_the_most_probable_paths(seed):
    gen = torch.Generator().manual_seed(seed)
    vocab, k = 12, 4
    matrix = AdjacencyMatrix(vocab, k)
    seen = torch.randperm(vocab, generator=gen)[:9]
    matrix.update(seen, torch.randn(9, vocab, generator=gen) * 3)
    budget, depth, min_prob = int(torch.randint(1, 12, (1,), generator=gen)), 4, [0.0, 0.01][seed % 2]
    tokens, parents, scores = matrix.expand_best_first(int(seen[0]), budget, depth, min_prob, width=3)
    assert len(tokens) - 1 <= budget and all(0 <= p < i for i, p in enumerate(parents) if i)
    path_prob = [1.0]
    for i in range(1, len(tokens)):
        row = matrix.table[tokens[parents[i]]].tolist()
        assert tokens[i] in row[:3], "a node that is not among its parent's recycled successors"
        assert scores[i] == pytest.approx(float(matrix.probs[tokens[parents[i]], row.index(tokens[i])]))
        path_prob.append(path_prob[parents[i]] * scores[i])
    want = reference_best_first(matrix, int(seen[0]), budget, depth, min_prob, width=3)
    assert sorted(path_prob[1:], reverse=True) == pytest.approx(want)


@pytest.mark.parametrize("seed", range(4))
def test_pair_rows_hold_the_last_write_per_pair_and_fall_back_to_single_rows(seed):
    gen = torch.Generator().manual_seed(seed)
    vocab, k = 40, 3
    matrix = AdjacencyMatrix(vocab, k, pair_bits=4)  # 16 slots: collisions happen and must fall back cleanly
    single, by_slot = {}, {}
    for _ in range(5):
        n = int(torch.randint(1, 10, (1,), generator=gen))
        tokens = torch.randint(0, 6, (n,), generator=gen)
        prev = torch.randint(-1, 6, (n,), generator=gen)
        logits = torch.randn(n, vocab, generator=gen)
        matrix.update(tokens, logits, prev)
        for t, b, row in zip(tokens.tolist(), prev.tolist(), logits):
            top = torch.sort(row, descending=True, stable=True).indices[:k].tolist()
            single[t] = top
            if b >= 0:
                key = b * vocab + t
                by_slot[int(matrix._slots(np.array([key]))[0])] = (key, top)
    for b in range(-1, 6):
        for t in range(6):
            succ, _ = matrix.rows(np.array([b]), np.array([t]))
            slot = int(matrix._slots(np.array([b * vocab + t]))[0]) if b >= 0 else None
            stored = by_slot.get(slot)
            if stored is not None and stored[0] == b * vocab + t:
                want = stored[1]
            else:
                want = single.get(t, [UNSEEN] * k)
            assert succ[0].tolist() == want, (b, t)


def test_expansions_read_pair_rows_first():
    matrix = AdjacencyMatrix(10, 2, pair_bits=8)
    matrix.table[:] = np.array([[(t + 1) % 10, (t + 2) % 10] for t in range(10)])
    matrix.probs[:] = 0.5
    matrix.update(torch.tensor([3]), torch.eye(10)[[7]] * 5 + torch.eye(10)[[8]] * 4, prev=torch.tensor([2]))
    matrix.table[3] = [4, 5]  # the single row of 3 says something else
    # after (2, 3) the pair row says 7, 8; after (9, 3) the single row says 4, 5
    assert matrix.expand(3, template_layout(((0,), (1,))), prev=2) == ([3, 7, 8], [-1, 0, 0])
    assert matrix.expand(3, template_layout(((0,), (1,))), prev=9) == ([3, 4, 5], [-1, 0, 0])
    tokens, parents, _ = matrix.expand_best_first(3, 2, 1, prev=2)
    assert sorted(tokens[1:]) == [7, 8]
    tokens, _ = matrix.expand(2, template_layout(((0,), (0, 0))), prev=9)  # 2 -> 3 (single), then pair (2, 3)
    assert tokens == [2, 3, 7]


needs_kernels = pytest.mark.skipif(not cpu_kernels.available(), reason="compiled CPU kernels unavailable")


def _random_matrices(seed: int, vocab: int, k: int, pair_bits: int) -> tuple[AdjacencyMatrix, AdjacencyMatrix]:
    """The same random writes into a compiled matrix and a numpy one: tokens repeating within a step, pairs
    colliding on few slots, prev -1 at times."""
    gen = torch.Generator().manual_seed(seed)
    compiled, numpy_ = AdjacencyMatrix(vocab, k, pair_bits), AdjacencyMatrix(vocab, k, pair_bits)
    compiled.compiled, numpy_.compiled = True, False
    for _ in range(6):
        n = int(torch.randint(1, 14, (1,), generator=gen))
        tokens = torch.randint(0, vocab // 2, (n,), generator=gen)
        prev = torch.randint(-1, vocab // 2, (n,), generator=gen)
        logits = torch.randn(n, vocab, generator=gen)
        for matrix in (compiled, numpy_):
            matrix.update(tokens, logits, prev)
    return compiled, numpy_


@needs_kernels
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("pair_bits", [0, 3, 10])
def test_compiled_writes_leave_the_arrays_the_numpy_reference_leaves(seed, pair_bits):
    compiled, numpy_ = _random_matrices(seed, 40, 4, pair_bits)
    for name in ("table", "probs", "pair_keys", "pair_table", "pair_probs"):
        np.testing.assert_array_equal(getattr(compiled, name), getattr(numpy_, name), err_msg=name)
    assert (compiled.table != UNSEEN).any()


@needs_kernels
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("pair_bits", [0, 3, 10])
def test_compiled_expansions_equal_the_numpy_reference_with_scores(seed, pair_bits):
    compiled, numpy_ = _random_matrices(seed, 40, 4, pair_bits)
    choices = ((0,), (1,), (3,), (5,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 3), (1, 0, 0), (0, 0, 0, 0))
    layout = template_layout(choices)
    roots = list(range(40))  # seen and unseen rows alike (only the first half is ever written)
    prevs = [(r * 7) % 23 - 1 for r in roots]
    for depth in (None, 1, 2, 3):
        got = compiled.expand_many(roots, prevs, layout, depth)
        want = numpy_.expand_many(roots, prevs, layout, depth)
        assert got == want, depth
        assert [numpy_.expand(r, layout, depth, p) for r, p in zip(roots, prevs)] == [g[:2] for g in got]
    assert max(len(tokens) for tokens, _, _ in got) > 3  # the case is not trivially empty


@needs_kernels
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("pair_bits", [0, 3, 10])
def test_compiled_best_first_trees_equal_the_heap_reference(seed, pair_bits):
    compiled, numpy_ = _random_matrices(seed, 40, 4, pair_bits)
    if seed % 2:  # equal probabilities everywhere: the order of offers alone decides (heapq's tie rule)
        for matrix in (compiled, numpy_):
            matrix.probs[matrix.probs > 0] = 0.5
            matrix.pair_probs[matrix.pair_probs > 0] = 0.5
    roots = list(range(40))  # seen and unseen rows alike
    prevs = [(r * 7) % 23 - 1 for r in roots]
    sizes = []
    for budget, depth, min_prob, width in [(6, 6, 0.0, 4), (8, 3, 0.0, 2), (12, 8, 1e-3, None), (1, 1, 0.0, 1),
                                           (0, 4, 0.0, 4), (5, 0, 0.0, 4), (8, 6, 0.2, 3)]:
        got = compiled.expand_best_first_many(roots, prevs, budget, depth, min_prob, width)
        want = numpy_.expand_best_first_many(roots, prevs, budget, depth, min_prob, width)
        assert got == want, (budget, depth, min_prob, width)
        sizes += [len(tokens) for tokens, _, _ in got]
    assert max(sizes) >= 6  # the trees are not trivially empty
