"""Stochastic trees: each node's children drawn without replacement from q, each passed on with the
distribution it was drawn from (q without its earlier siblings), in a shape fixed before the draws."""

from __future__ import annotations

import pytest
import torch

from specdec.tree.sampled import SampledGrowth, sampled_widths
from specdec.tree.spec import chain, dynamic, static


@pytest.mark.parametrize("spec,widths", [
    (dynamic(depth=3, topk=2, budget=6), (2, 1, 1)),
    (dynamic(depth=6, topk=8, budget=60), (8, 1, 1, 1, 1, 1)),
    (dynamic(depth=3, topk=4, budget=30), (4, 3, 1)),  # 4 + 12 + 12 nodes
    (dynamic(depth=4, topk=4, budget=3), (1, 1, 1, 1)),
])
def test_dynamic_specs_become_fixed_widths_within_the_budget(spec, widths):
    assert sampled_widths(spec) == widths


def test_each_depth_share_goes_to_the_likeliest_paths_before_drawing():
    """depth 2, budget 4: two nodes a depth. The root's two children are drawn from q; at depth 2 the two slots
    go to the pairs of highest path score x q rank, here both under the likelier child."""
    growth = SampledGrowth(0, dynamic(depth=2, topk=4, budget=4))
    assert growth.allocate(torch.tensor([[0.7, 0.2, 0.1, 0.0]])) == [2]
    growth.expand(torch.tensor([[0.0, 0.9, 0.1, 0.0]]), torch.Generator().manual_seed(0))
    first, second = growth.tree().token_list[1:]
    assert growth.scores[1:] == pytest.approx([0.9 if t == 1 else 0.1 for t in (first, second)])
    confident, unsure = torch.tensor([0.0, 0.0, 0.6, 0.4]), torch.tensor([0.25, 0.25, 0.25, 0.25])
    rows = torch.stack([confident, unsure] if first == 1 else [unsure, confident])
    assert growth.allocate(rows) == ([2, 0] if first == 1 else [0, 2])
    growth.expand(rows, torch.Generator().manual_seed(1))
    assert growth.done and len(growth.tree().token_list) == 5
    likely = 1 if first == 1 else 2
    assert growth.tree().parent_list[3:] == [likely, likely]


def test_fixed_widths_ignore_the_scores():
    growth = SampledGrowth(0, dynamic(depth=2, topk=4, budget=4), adaptive=False)  # widths (2, 1)
    growth.expand(torch.tensor([[0.0, 0.9, 0.1, 0.0]]), torch.Generator().manual_seed(0))
    growth.expand(torch.tensor([[0.0, 0.0, 0.6, 0.4], [0.25, 0.25, 0.25, 0.25]]), torch.Generator().manual_seed(1))
    assert growth.tree().parent_list == [-1, 0, 0, 1, 2]


def test_each_sibling_row_is_q_without_the_earlier_siblings():
    q = torch.tensor([0.5, 0.3, 0.2, 0.0])
    growth = SampledGrowth(9, dynamic(depth=1, topk=3, budget=3))
    growth.expand(q[None], torch.Generator().manual_seed(0))
    tree = growth.tree()
    first, second, third = tree.token_list[1:]
    assert len({first, second, third}) == 3 and 3 not in (first, second, third)
    assert torch.allclose(tree.draft_probs[1], q)
    expect = q.clone()
    expect[first] = 0
    assert torch.allclose(tree.draft_probs[2], expect / expect.sum())
    expect[second] = 0
    assert torch.allclose(tree.draft_probs[3], expect / expect.sum())
    assert growth.done


def test_a_node_draws_fewer_children_only_when_q_runs_out():
    growth = SampledGrowth(0, dynamic(depth=1, topk=3, budget=3))
    growth.expand(torch.tensor([[0.0, 1.0, 0.0]]), None)
    assert growth.tree().token_list == [0, 1]


def test_static_specs_keep_their_shape():
    spec = static([[0], [1], [0, 0], [0, 1], [1, 0]])
    growth = SampledGrowth(0, spec)
    gen = torch.Generator().manual_seed(1)
    q = torch.full((8,), 1 / 8)
    growth.expand(q[None], gen)
    growth.expand(q.repeat(2, 1), gen)
    assert growth.done and growth.tree().parent_list == [-1, 0, 0, 1, 1, 2]


def test_first_children_follow_q():
    q = torch.tensor([0.6, 0.3, 0.1])
    gen = torch.Generator().manual_seed(3)
    counts = torch.zeros(3)
    for _ in range(3000):
        growth = SampledGrowth(0, chain(1))
        growth.expand(q[None], gen)
        counts[growth.tree().token_list[1]] += 1
    assert torch.allclose(counts / 3000, q, atol=0.03)
