"""Per-node logits processing: each tree node's row is processed from the committed tokens plus the node's own
path, exactly as plain decoding would process the row for that context."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.config import SamplingParams
from specdec.sampling.history import row_history
from specdec.sampling.processors import process_logits, processed_rows
from specdec.tree.token_tree import TokenTree

V = 6


def one_row(prompt, output, params, logits, stop_ids=frozenset()):
    history = row_history(prompt, output, None, V, torch.device("cpu"))
    return process_logits(torch.tensor([logits]), params, history, stop_ids)[0].tolist()


def test_frequency_and_presence_count_the_output_only():
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    out = one_row([1, 1, 1], [2, 2, 3], params, [0.0] * V)
    assert out == pytest.approx([0.0, 0.0, -1.25, -0.75, 0.0, 0.0])


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    params = SamplingParams(repetition_penalty=2.0)
    out = one_row([0], [1], params, [4.0, -4.0, 4.0, -4.0, 1.0, 1.0])
    assert out == pytest.approx([2.0, -8.0, 4.0, -4.0, 1.0, 1.0])


def test_logit_bias_is_added():
    out = one_row([0], [], SamplingParams(logit_bias={3: 2.5, 5: -100}), [1.0] * V)
    assert out == pytest.approx([1.0, 1.0, 1.0, 3.5, 1.0, -99.0])


def test_min_new_tokens_masks_stop_tokens_only_before_the_minimum():
    params = SamplingParams(min_new_tokens=2, stop_token_ids=[4])
    assert one_row([0], [1], params, [1.0] * V, frozenset({4, 5})) == [1.0, 1.0, 1.0, 1.0, -math.inf, -math.inf]
    assert one_row([0], [1, 2], params, [1.0] * V, frozenset({4, 5})) == [1.0] * V


def test_each_tree_row_counts_the_committed_tokens_and_its_own_path():
    #   0:root(2) -> 1:3 -> 3:3
    #            \-> 2:4
    tree = TokenTree.from_parents([2, 3, 4, 3], [-1, 0, 0, 1])
    params = SamplingParams(frequency_penalty=1.0)
    rows = processed_rows(torch.zeros(4, V), params, [0], [5, 2], tree, frozenset())
    expected = [
        [0, 0, -1, 0, 0, -1],  # root: the output so far (5, 2)
        [0, 0, -1, -1, 0, -1],  # + node 1's 3
        [0, 0, -1, 0, -1, -1],  # + node 2's 4 (not its sibling's 3)
        [0, 0, -1, -2, 0, -1],  # + 3 twice on its path
    ]
    assert rows.tolist() == expected


def test_tree_rows_equal_the_rows_plain_decoding_would_process_for_the_same_context():
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(repetition_penalty=1.7, frequency_penalty=0.4, presence_penalty=-0.3,
                            logit_bias={1: 0.5}, min_new_tokens=4, stop_token_ids=[5])
    parents = [-1, 0, 0, 1, 1, 3, 2, 6]
    tokens = [3, 1, 4, 1, 5, 1, 2, 2]
    tree = TokenTree.from_parents(tokens, parents)
    logits = torch.randn(len(tokens), V, generator=gen) * 3
    prompt, output = [0, 4, 4], [3]
    rows = processed_rows(logits, params, prompt, output, tree, frozenset({0}))
    for node in range(len(tokens)):
        path, i = [], node
        while i > 0:
            path.append(tokens[i])
            i = parents[i]
        context = output + path[::-1]
        plain = processed_rows(logits[node: node + 1], params, prompt, context, None, frozenset({0}))
        assert rows[node].tolist() == plain[0].tolist(), node


def test_unpenalised_params_pass_the_logits_through():
    logits = torch.randn(3, V)
    tree = TokenTree.chain([1, 2, 3])
    assert processed_rows(logits, SamplingParams(temperature=0.7, min_p=0.2), [0], [1], tree, frozenset()) is logits


def _dense_penalties(logits, prompt, output, tree, params):
    """The penalties over the whole vocabulary, row by row from each node's context: the definition."""
    vocab = logits.shape[-1]
    rows = []
    paths = [[]] if tree is None else [[int(tree.tokens[a]) for a in range(1, len(tree)) if tree.ancestor_mask[i, a]]
                                       for i in range(len(tree))]
    for row, path in zip(logits, paths):
        counts = torch.bincount(torch.tensor(output + path, dtype=torch.int64), minlength=vocab).float()
        seen = counts > 0
        seen[torch.tensor(prompt)] = True
        r = params.repetition_penalty
        row = torch.where(seen, torch.where(row > 0, row / r, row * r), row)
        row = row - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).float()
        rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("seed", range(4))
def test_penalties_over_the_tokens_that_occur_equal_them_over_the_whole_vocabulary(seed):
    gen = torch.Generator().manual_seed(seed)
    vocab = 500
    prompt = torch.randint(0, vocab, (40,), generator=gen).tolist()
    output = torch.randint(0, vocab, (25,), generator=gen).tolist()
    parents = [-1, 0, 0, 1, 1, 2, 3]
    tree = TokenTree.from_parents([output[-1]] + torch.randint(0, vocab, (6,), generator=gen).tolist(), parents)
    logits = torch.randn(len(tree), vocab, generator=gen) * 3
    params = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2)
    got = processed_rows(logits, params, prompt, output, tree, frozenset())
    assert torch.equal(got, _dense_penalties(logits, prompt, output, tree, params))
