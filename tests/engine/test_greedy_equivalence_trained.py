"""Greedy speculative decoding must emit exactly what plain greedy decoding emits, on the real default model: the
trained drafters (their heads ship with the package).

fp32 rounding can, in principle, flip an argmax where the top two logits are nearly tied, because a tree
verification computes the same row in a different batch shape. The test never loosens the comparison: where
outputs diverge, it requires the divergence to be at such a near-tie (top-2 logit gap below 1e-3).
"""

from __future__ import annotations

import pytest

from tests.engine.greedy_check import check_greedy_equivalence, full_trees, plain_outputs  # noqa: F401

CONFIGS = [
    ("draft", "chain:k=4"),
    ("draft", "dynamic:depth=4,topk=4,budget=12"),
    # reduced-vocabulary heads (the 4096 most frequent target tokens of the training corpus)
    ("draft:vocab=4096", "chain:k=4"),
    ("eagle:vocab=4096", "dynamic:depth=5,topk=3,budget=7"),
    ("medusa:vocab=4096", "static:medusa-8"),
]


@pytest.mark.parametrize("drafter,tree", CONFIGS)
def test_speculative_greedy_equals_plain_greedy(full_trees, plain_outputs, drafter, tree):  # noqa: F811
    check_greedy_equivalence(full_trees, plain_outputs, drafter, tree)
