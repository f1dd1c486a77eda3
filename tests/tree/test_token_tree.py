"""Token trees: every derived buffer (ancestor mask, positions, depths, children, paths) from the parent array,
checked against trees worked out by hand; malformed parent arrays are refused with a message that says why."""

from __future__ import annotations

import pytest
import torch

from specdec.errors import ConfigError
from specdec.tree.token_tree import TokenTree, validate_parents

#   A branched tree, by hand (node: token):
#
#        0:10
#       /    \
#     1:11   2:12
#    /   \      \
#  3:13  4:14   5:15
#   |
#  6:16
BRANCHED_TOKENS = [10, 11, 12, 13, 14, 15, 16]
BRANCHED_PARENTS = [-1, 0, 0, 1, 1, 2, 3]


@pytest.fixture
def branched() -> TokenTree:
    return TokenTree.from_parents(BRANCHED_TOKENS, BRANCHED_PARENTS)


def test_chain_has_parents_in_a_line():
    tree = TokenTree.chain([5, 6, 7, 8])
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    assert tree.tokens.tolist() == [5, 6, 7, 8]
    assert tree.tokens.dtype == torch.int64 and tree.parents.dtype == torch.int64
    assert len(tree) == 4
    assert tree.is_chain


def test_chain_ancestor_mask_is_lower_triangular():
    tree = TokenTree.chain([5, 6, 7, 8])
    assert torch.equal(tree.ancestor_mask, torch.ones(4, 4, dtype=torch.bool).tril())


def test_chain_depths_positions_children_and_single_path():
    tree = TokenTree.chain([5, 6, 7, 8])
    assert tree.depth.tolist() == [0, 1, 2, 3]
    assert tree.positions(10).tolist() == [10, 11, 12, 13]
    assert tree.children == [[1], [2], [3], []]
    assert tree.paths == [[0, 1, 2, 3]]


def test_root_alone_is_a_chain_of_no_drafts():
    tree = TokenTree.chain([9])
    assert len(tree) == 1 and tree.is_chain
    assert tree.paths == [[0]]
    assert tree.ancestor_mask.tolist() == [[True]]


def test_branched_ancestor_mask_marks_each_node_and_its_ancestors(branched):
    expected = [
        # 0  1  2  3  4  5  6
        [1, 0, 0, 0, 0, 0, 0],  # 0
        [1, 1, 0, 0, 0, 0, 0],  # 1
        [1, 0, 1, 0, 0, 0, 0],  # 2
        [1, 1, 0, 1, 0, 0, 0],  # 3
        [1, 1, 0, 0, 1, 0, 0],  # 4
        [1, 0, 1, 0, 0, 1, 0],  # 5
        [1, 1, 0, 1, 0, 0, 1],  # 6
    ]
    assert torch.equal(branched.ancestor_mask, torch.tensor(expected, dtype=torch.bool))


def test_branched_depths_and_positions(branched):
    assert branched.depth.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert branched.positions(0).tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert branched.positions(7).tolist() == [7, 8, 8, 9, 9, 9, 10]


def test_branched_children_are_listed_in_index_order(branched):
    assert branched.children == [[1, 2], [3, 4], [5], [6], [], [], []]


def test_branched_paths_run_from_the_root_to_each_leaf(branched):
    assert branched.paths == [[0, 1, 4], [0, 2, 5], [0, 1, 3, 6]]
    assert not branched.is_chain


def test_star_tree_has_every_draft_as_a_leaf():
    tree = TokenTree.from_parents([1, 2, 3, 4], [-1, 0, 0, 0])
    assert tree.paths == [[0, 1], [0, 2], [0, 3]]
    assert tree.depth.tolist() == [0, 1, 1, 1]
    assert tree.ancestor_mask.sum(1).tolist() == [1, 2, 2, 2]
    assert not tree.is_chain


@pytest.mark.parametrize(
    "parents, message",
    [
        ([], "at least a root"),
        ([0, 0], "node 0 must be the root"),
        ([2, -1, 0], "node 0 must be the root"),
        ([-1, 0, -1], "node 2 is a second root"),
        ([-1, 1], "node 1 is its own parent"),
        ([-1, 2, 1], "node 1 comes before its parent 2"),  # 1 -> 2 -> 1 is also a cycle
        ([-1, 0, 3, 2], "node 2 comes before its parent 3"),
        ([-1, 0, -5], "node 2 has an invalid parent -5"),
    ],
)
def test_malformed_parents_raise_config_error_naming_the_problem(parents, message):
    with pytest.raises(ConfigError, match=message):
        validate_parents(parents)
    with pytest.raises(ConfigError, match=message):
        TokenTree.from_parents(list(range(len(parents))), parents)


def test_tree_built_directly_from_tensors_is_validated():
    with pytest.raises(ConfigError, match="second root"):
        TokenTree(torch.tensor([1, 2, 3]), torch.tensor([-1, -1, 0]))


def test_token_and_parent_counts_must_match():
    with pytest.raises(ConfigError, match="one parent per token"):
        TokenTree(torch.tensor([1, 2, 3]), torch.tensor([-1, 0]))


def test_draft_probs_need_one_row_per_node():
    TokenTree.chain([1, 2, 3], draft_probs=torch.full((3, 8), 1 / 8))
    with pytest.raises(ConfigError, match="one row per tree node"):
        TokenTree.chain([1, 2, 3], draft_probs=torch.full((2, 8), 1 / 8))
