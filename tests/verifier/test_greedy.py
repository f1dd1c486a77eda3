"""Greedy verification: the accepted path is the longest root-to-node path on which every drafted token is the
target's argmax after its parent, and the bonus token is the target's argmax after the last accepted node.

As in vLLM's rejection-sampler tests, each case builds logits whose argmax after node i is a chosen token.
"""

from __future__ import annotations

import torch

from specdec.tree.token_tree import TokenTree
from specdec.verifier import VerifyResult, verify_greedy

VOCAB = 32


def logits_choosing(argmax: list[int], seed: int = 0) -> torch.Tensor:
    """`[N, VOCAB]` logits: random noise in [0, 1), plus 5 on the chosen token of each row."""
    logits = torch.rand(len(argmax), VOCAB, generator=torch.Generator().manual_seed(seed))
    logits[torch.arange(len(argmax)), torch.tensor(argmax)] += 5.0
    return logits


def test_chain_fully_accepted_takes_the_bonus_from_the_last_node():
    tree = TokenTree.chain([5, 1, 2, 3])
    result = verify_greedy(tree, logits_choosing([1, 2, 3, 7]))
    assert result == VerifyResult(accepted_nodes=[0, 1, 2, 3], tokens=[1, 2, 3, 7], bonus_token=7)
    assert result.num_accepted_drafts == 3


def test_chain_with_the_first_draft_rejected_emits_only_the_targets_choice_at_the_root():
    tree = TokenTree.chain([5, 1, 2, 3])
    # rows after nodes 1 and 2 would accept their children, but node 1 itself is wrong
    result = verify_greedy(tree, logits_choosing([9, 2, 3, 7]))
    assert result.accepted_nodes == [0]
    assert result.tokens == [9]
    assert result.bonus_token == 9
    assert result.num_accepted_drafts == 0


def test_chain_accepts_up_to_the_first_mismatch():
    tree = TokenTree.chain([5, 1, 2, 3])
    result = verify_greedy(tree, logits_choosing([1, 2, 8, 7]))
    assert result.accepted_nodes == [0, 1, 2]
    assert result.tokens == [1, 2, 8]
    assert result.bonus_token == 8


def test_root_alone_emits_one_token():
    result = verify_greedy(TokenTree.chain([4]), logits_choosing([11]))
    assert result == VerifyResult(accepted_nodes=[0], tokens=[11], bonus_token=11)


#        0:10
#       /    \
#     1:11   2:12
#    /   \      \
#  3:13  4:14   5:15
#   |
#  6:16
BRANCHED = TokenTree.from_parents([10, 11, 12, 13, 14, 15, 16], [-1, 0, 0, 1, 1, 2, 3])


def test_branch_where_the_second_sibling_is_the_targets_choice():
    # the target picks 12 at the root (node 2, the second child), then 15 (node 5), then 20 after the leaf
    result = verify_greedy(BRANCHED, logits_choosing([12, 13, 15, 16, 0, 20, 0]))
    assert result.accepted_nodes == [0, 2, 5]
    assert result.tokens == [12, 15, 20]
    assert result.bonus_token == 20


def test_branch_second_sibling_accepted_below_a_first_sibling():
    # root -> node 1 (first child), then 14 picks node 4 (second child of node 1); bonus from node 4's row
    result = verify_greedy(BRANCHED, logits_choosing([11, 14, 0, 0, 21, 0, 0]))
    assert result.accepted_nodes == [0, 1, 4]
    assert result.tokens == [11, 14, 21]


def test_deepest_path_of_a_branched_tree_is_accepted_in_full():
    result = verify_greedy(BRANCHED, logits_choosing([11, 13, 0, 16, 0, 0, 25]))
    assert result.accepted_nodes == [0, 1, 3, 6]
    assert result.tokens == [11, 13, 16, 25]
    assert result.bonus_token == 25


def test_branched_tree_with_no_matching_child_rejects_at_the_root():
    result = verify_greedy(BRANCHED, logits_choosing([30, 13, 15, 16, 0, 0, 0]))
    assert result.accepted_nodes == [0]
    assert result.tokens == [30]


def test_rejection_below_an_accepted_node_takes_the_bonus_from_that_node():
    # node 2 accepted, but its only child (15) is not the target's choice 31
    result = verify_greedy(BRANCHED, logits_choosing([12, 0, 31, 0, 0, 0, 0]))
    assert result.accepted_nodes == [0, 2]
    assert result.tokens == [12, 31]
    assert result.bonus_token == 31


def test_emitted_tokens_equal_plain_greedy_decoding_of_the_same_target():
    """Whatever the tree, greedy verification emits a prefix of what the target would have decoded alone.

    A toy target whose argmax after token t is (3t + 1) mod VOCAB; trees of random tokens that sometimes agree.
    """
    def target_next(token: int) -> int:
        return (3 * token + 1) % VOCAB

    gen = torch.Generator().manual_seed(7)
    for _ in range(50):
        n = int(torch.randint(1, 9, (1,), generator=gen))
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        tokens = [int(torch.randint(0, VOCAB, (1,), generator=gen))]
        for p in parents[1:]:
            right = bool(torch.rand((), generator=gen) < 0.6)
            tokens.append(target_next(tokens[p]) if right else int(torch.randint(0, VOCAB, (1,), generator=gen)))
        tree = TokenTree.from_parents(tokens, parents)
        result = verify_greedy(tree, logits_choosing([target_next(t) for t in tokens]))
        plain = [tokens[0]]
        for _ in range(len(result.tokens)):
            plain.append(target_next(plain[-1]))
        assert result.tokens == plain[1:]
        depths = tree.depth.tolist()
        assert [depths[i] for i in result.accepted_nodes] == list(range(len(result.accepted_nodes)))
        # the path is the longest one possible: no child of the last accepted node is the target's choice
        last = result.accepted_nodes[-1]
        assert all(tokens[c] != target_next(tokens[last]) for c in tree.children[last])


def test_a_tree_row_with_nan_or_plus_inf_stops_verification_and_minus_inf_does_not():
    """The engine leaves the NaN/Inf check of greedily verified rows to this read (`Engine._check_finite`), so
    it must raise on NaN or +Inf in any row, and let -Inf (a token a sampling control ruled out) through."""
    import pytest

    from specdec.errors import NumericalError
    from specdec.verifier import verify_greedy_batch

    tree = TokenTree.from_parents([5, 1, 2], [-1, 0, 0])
    for bad in (float("nan"), float("inf")):
        logits = torch.zeros(3, 8)
        logits[0, 1] = 1.0
        logits[2, 4] = bad  # a node off the accepted path
        with pytest.raises(NumericalError, match="NaN/Inf logits"):
            verify_greedy_batch([tree], [logits])
    logits = torch.zeros(3, 8)
    logits[0, 1] = 1.0
    logits[1, 3] = 2.0
    logits[:, 0] = -float("inf")
    result = verify_greedy_batch([tree], [logits])[0]
    assert result.accepted_nodes == [0, 1] and result.tokens == [1, 3]
