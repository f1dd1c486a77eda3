"""Greedy speculative output equals plain greedy output for the trained drafters (heads shipped with the
package); the comparison and its near-tie rule are in greedy_check.py, the model-free drafters in
test_greedy_equivalence.py."""

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
