"""Speculative sampling must follow the target's processed distribution exactly, whatever the drafter proposes.

Through the real engine (drafter, one target pass, verifier, KV commit), for the draft model, EAGLE, Medusa and
n-gram drafters, chains and trees of depth 3, at T=1, T=0.7, T=0.5, top-k and top-p, with drafters that are accepted
30-70% of the time at depth 1 (so verification decides often, both ways). Each request generates 5 tokens: the
first from the prefill, and the bonus after a fully accepted first tree still inside the horizon. Two cases
cut every tree to a random depth each step (0 included), as the adaptive planner may. The samples
are tested against an exact reference computed without the engine and without `target_probs` (see
`tests/verifier/lossless.py`); a sample of probability 0 fails outright.

The test has power: each planted wrong rule (accepting with min(1, q/p), the bonus after a full path drawn
from the parent's row, the bonus after a rejection drawn from p instead of the residual, an untempered q, a
residual not renormalised between siblings) must fail the same test with p < 1e-6.
`tools/lossless_power.py` reports the p-values over several seeds.
"""

from __future__ import annotations

import pytest
import torch

from specdec.tree.token_tree import TokenTree
from specdec.verifier import rules
from tests.verifier import lossless as L

ALPHA = 1e-4  # the real verifier fails a case with this probability (the views are Bonferroni-combined)
PLANTED_ALPHA = 1e-6

pytestmark = pytest.mark.timeout(300)  # a case takes seconds; a hang fails in minutes


@pytest.fixture(scope="module")
def models() -> L.Models:
    return L.build_models()


@pytest.fixture(scope="module")
def joints(models):
    cache: dict = {}

    def joint(params):
        key = (params.temperature, params.top_k, params.top_p)
        if key not in cache:
            cache[key] = L.exact_joint(models.target, params)
        return cache[key]

    return joint


@pytest.mark.parametrize("name", list(L.CASES))
def test_speculative_sampling_matches_target_distribution(models, joints, name):
    case = L.CASES[name]
    sampled = L.sample(models, case)
    assert 0.3 <= sampled.accept_depth1 <= 0.7, (
        f"{name}: drafts accepted at depth 1 in {sampled.accept_depth1:.0%} of steps; the case tests little "
        "outside 30-70% (retune the tiny drafter in tests/verifier/lossless.py)")
    assert sampled.accept_full > 0, f"{name}: no tree was ever accepted to its full depth"
    fit = L.goodness_of_fit(sampled.tokens, joints(case.params))
    assert fit.impossible == 0, f"{name}: {fit.impossible} samples the target gives probability 0"
    assert fit.p_value > ALPHA, f"{name}: samples do not follow the target distribution: {fit.describe()}"


@pytest.mark.parametrize("name", list(L.PLANTED_CASES))
def test_planted_wrong_rule_is_caught(models, joints, monkeypatch, name):
    bug, case_name = L.PLANTED_CASES[name]
    case = L.CASES[case_name]
    rule = L.planted_rule(bug, case.params.temperature)
    L.patch_verifier(monkeypatch, rule)
    sampled = L.sample(models, case)
    assert rule.calls > 0, "the planted rule was never called: the engine verifies somewhere else now"
    fit = L.goodness_of_fit(sampled.tokens, joints(case.params))
    assert fit.p_value < PLANTED_ALPHA, f"planted rule '{name}' passed on {case_name}: {fit.describe()}"


def random_tree(gen: torch.Generator, vocab: int, sampled: bool) -> tuple[TokenTree, torch.Tensor]:
    """A random tree of 1-7 drafted nodes and a target distribution after each node (some zeros)."""
    n = int(torch.randint(2, 9, (), generator=gen))
    parents = [-1] + [int(torch.randint(0, i, (), generator=gen)) for i in range(1, n)]
    tokens = torch.randint(0, vocab, (n,), generator=gen).tolist()
    probs = torch.softmax(torch.randn(n, vocab, generator=gen) * 2, -1)
    probs[torch.rand(n, vocab, generator=gen) < 0.2] = 0.0
    probs[torch.arange(n), torch.tensor(tokens)[torch.tensor(parents).clamp_min(0)]] += 0.1
    probs = probs / probs.sum(-1, keepdim=True)
    draft = torch.softmax(torch.randn(n, vocab, generator=gen), -1) if sampled else None
    return TokenTree.from_parents(tokens, parents, draft), probs


def test_planted_rules_differ_from_the_real_rule_only_by_their_bug():
    """The rewritten rule without a bug draws exactly what `verify_stochastic` draws; each bug changes some
    draws. Otherwise a planted rule could fail the test for a reason other than its bug."""
    gen = torch.Generator().manual_seed(0)
    changed = {bug: 0 for bug, _ in L.PLANTED_CASES.values()}
    for i in range(300):
        tree, probs = random_tree(gen, 6, sampled=i % 2 == 0)
        real = rules.verify_stochastic(tree, probs, torch.Generator().manual_seed(i))
        again = L.planted_rule(None, 0.7)(tree, probs, torch.Generator().manual_seed(i))
        assert again == real
        for bug in changed:
            changed[bug] += L.planted_rule(bug, 0.7)(tree, probs, torch.Generator().manual_seed(i)) != real
    assert all(changed.values()), f"a planted bug never changes a draw: {changed}"


def test_the_reference_never_calls_target_probs(models, monkeypatch):
    """A bug in `target_probs` (top-p ignored, say) must not also be in the reference it is tested against."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the exact reference used specdec.sampling.target_probs")

    monkeypatch.setattr("specdec.sampling.target_probs", forbidden)
    joint = L.exact_joint(models.target, L.TOP_P, horizon=2)
    assert joint.dtype == torch.float64 and float(joint.sum()) == pytest.approx(1.0, abs=1e-12)
    assert (joint == 0).any(), "top-p leaves some pairs impossible"


def test_a_sample_in_an_impossible_cell_fails_outright():
    joint = torch.zeros(L.VOCAB, L.VOCAB, dtype=torch.float64)
    joint[:4, :4] = 1 / 16
    tokens = torch.randint(0, 4, (4000, 2), generator=torch.Generator().manual_seed(0))
    assert L.goodness_of_fit(tokens, joint).p_value > 0.01
    tokens[17] = torch.tensor([0, 5])
    fit = L.goodness_of_fit(tokens, joint)
    assert fit.impossible == 1 and fit.p_value == 0.0


def test_the_statistic_is_calibrated_on_exact_samples(models, joints):
    """Samples drawn straight from the exact joint must fail at about the nominal rate, not more often: a
    statistic that rejects the truth too often would let a test pass only by luck of the seed."""
    joint = joints(L.T05)
    gen = torch.Generator().manual_seed(0)
    draws = torch.multinomial(joint.flatten(), 400 * 2000, replacement=True, generator=gen).view(400, 2000)
    strides = torch.tensor([L.VOCAB ** (L.HORIZON - 1 - k) for k in range(L.HORIZON)])
    p_values = [L.goodness_of_fit((d[:, None] // strides) % L.VOCAB, joint).p_value for d in draws]
    rejected = sum(p < 0.05 for p in p_values)
    assert rejected <= 40, f"{rejected} of 400 exact samples rejected at 0.05 (expected at most about 20)"


def test_rare_cells_are_pooled_until_the_pool_expects_enough():
    """One sample in a cell expected 0.01 times must not fail the test by itself (the pool absorbs it)."""
    expected = torch.tensor([0.01, 0.02, 500.0, 499.97], dtype=torch.float64)
    observed = torch.tensor([1.0, 0.0, 500.0, 499.0], dtype=torch.float64)
    assert L.chi_square(observed, expected) > 0.5
    assert L.chi_square(torch.tensor([0.0, 0.0, 700.0, 300.0]), expected) < 1e-10
