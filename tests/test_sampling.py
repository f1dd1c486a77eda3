"""Logits processing and seeded sampling: the distribution each row samples from is exactly the one the user
asked for (greedy, temperature, top-k, top-p), and a seed makes the draws repeatable."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.config import SamplingParams
from specdec.errors import ConfigError
from specdec.sampling import make_generator, sample, target_probs, uniform

CPU = torch.device("cpu")


def logits_of(probs: list[float]) -> torch.Tensor:
    """One row of logits whose softmax is `probs`."""
    return torch.tensor([probs], dtype=torch.float64).log().float()


def test_greedy_is_one_hot_on_the_argmax_of_each_row():
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.5], [3.0, 1.0, 2.9, -4.0]])
    probs = target_probs(logits, SamplingParams(temperature=0.0))
    assert probs.dtype == torch.float32
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


def test_greedy_ignores_top_k_and_top_p():
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.5]])
    probs = target_probs(logits, SamplingParams(temperature=0.0, top_k=1, top_p=0.1))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_greedy_accepts_half_precision_logits_and_returns_float32():
    logits = torch.tensor([[0.1, 2.0, -1.0]], dtype=torch.bfloat16)
    probs = target_probs(logits, SamplingParams())
    assert probs.dtype == torch.float32 and probs.tolist() == [[0.0, 1.0, 0.0]]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_divides_the_logits_before_the_softmax(temperature):
    logits = torch.tensor([[1.0, 2.0, 3.0, -1.0]])
    probs = target_probs(logits, SamplingParams(temperature=temperature))
    expected = [math.exp(x / temperature) for x in [1.0, 2.0, 3.0, -1.0]]
    expected = [e / sum(expected) for e in expected]
    assert probs[0].tolist() == pytest.approx(expected, rel=1e-5)


def test_higher_temperature_flattens_the_distribution():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    cold = target_probs(logits, SamplingParams(temperature=0.5))[0]
    hot = target_probs(logits, SamplingParams(temperature=5.0))[0]
    assert cold[2] > hot[2] and cold[0] < hot[0]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_keeps_exactly_the_k_most_likely_tokens(k):
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.5, 0.9]])
    probs = target_probs(logits, SamplingParams(temperature=1.0, top_k=k))[0]
    top = logits[0].topk(k).indices.tolist()
    assert sorted(torch.nonzero(probs).flatten().tolist()) == sorted(top)
    expected = torch.softmax(logits[0, top], dim=-1)
    assert torch.allclose(probs[top], expected)


def test_top_k_at_or_above_the_vocabulary_size_keeps_every_token():
    logits = torch.tensor([[0.3, 2.0, -1.0]])
    full = target_probs(logits, SamplingParams(temperature=1.0))
    assert torch.allclose(target_probs(logits, SamplingParams(temperature=1.0, top_k=3)), full)
    assert torch.allclose(target_probs(logits, SamplingParams(temperature=1.0, top_k=50)), full)
    assert (full > 0).all()


def test_top_k_applies_to_each_row_separately():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    probs = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs > 0).tolist() == [[True, True, False, False], [False, False, True, True]]


# probs [0.1, 0.5, 0.15, 0.25]: sorted 0.5, 0.25, 0.15, 0.1, with mass 0.5, 0.75, 0.9, 1.0 so far
@pytest.mark.parametrize(
    "top_p, expected",
    [
        (0.3, [0.0, 1.0, 0.0, 0.0]),  # the top token alone already reaches 0.3
        (0.7, [0.0, 0.5 / 0.75, 0.0, 0.25 / 0.75]),  # 0.5 < 0.7 <= 0.75
        (0.8, [0.0, 0.5 / 0.9, 0.15 / 0.9, 0.25 / 0.9]),  # 0.75 < 0.8 <= 0.9
        (0.95, [0.1, 0.5, 0.15, 0.25]),  # needs every token
        (1.0, [0.1, 0.5, 0.15, 0.25]),  # off
    ],
)
def test_top_p_keeps_the_smallest_set_whose_mass_reaches_p(top_p, expected):
    probs = target_probs(logits_of([0.1, 0.5, 0.15, 0.25]), SamplingParams(temperature=1.0, top_p=top_p))
    assert probs[0].tolist() == pytest.approx(expected, abs=1e-6)


def test_top_p_always_keeps_at_least_the_most_likely_token():
    probs = target_probs(logits_of([0.2, 0.3, 0.25, 0.25]), SamplingParams(temperature=1.0, top_p=1e-9))
    assert probs[0].tolist() == pytest.approx([0.0, 1.0, 0.0, 0.0])


def _top_p_by_full_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition, over a full descending sort (what `_top_p` computed before it looked among the top k)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    sorted_probs = sorted_probs.masked_fill(sorted_probs.cumsum(-1) - sorted_probs >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(-1, keepdim=True)


@pytest.mark.parametrize("sharpness", [0.3, 1.0, 3.0, 8.0])  # 0.3: nearly flat rows, whose nucleus needs k to grow
@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.99, 0.999999])
def test_top_p_over_a_large_vocabulary_is_the_full_sort_definition(sharpness, top_p):
    gen = torch.Generator().manual_seed(int(sharpness * 10) + int(top_p * 1000))
    logits = torch.randn(6, 49152, generator=gen) * sharpness
    probs = target_probs(logits, SamplingParams(temperature=0.7, top_p=top_p))
    expect = _top_p_by_full_sort(torch.softmax(logits / 0.7, dim=-1), top_p)
    assert torch.equal(probs > 0, expect > 0)
    torch.testing.assert_close(probs, expect, rtol=1e-6, atol=1e-9)


def test_top_p_is_applied_after_top_k():
    # top-k 3 leaves 0.5, 0.25, 0.15 renormalised to 0.556, 0.278, 0.167; top-p 0.8 then needs the first two
    probs = target_probs(logits_of([0.1, 0.5, 0.15, 0.25]), SamplingParams(temperature=1.0, top_k=3, top_p=0.8))
    assert probs[0].tolist() == pytest.approx([0.0, 2 / 3, 0.0, 1 / 3], abs=1e-6)


def test_processed_rows_are_distributions():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    probs = target_probs(logits, SamplingParams(temperature=0.8, top_k=10, top_p=0.9))
    assert torch.allclose(probs.sum(-1), torch.ones(6))
    assert (probs >= 0).all()
    assert ((probs > 0).sum(-1) <= 10).all()


def test_same_seed_reproduces_the_same_draws():
    probs = torch.full((1000,), 1e-3)
    first, second = make_generator(1234, CPU), make_generator(1234, CPU)
    draws_a = [sample(probs, first) for _ in range(20)] + [uniform(first, CPU) for _ in range(5)]
    draws_b = [sample(probs, second) for _ in range(20)] + [uniform(second, CPU) for _ in range(5)]
    assert draws_a == draws_b


def test_different_seeds_give_different_draws():
    probs = torch.full((1000,), 1e-3)
    a, b = make_generator(1, CPU), make_generator(2, CPU)
    assert [sample(probs, a) for _ in range(20)] != [sample(probs, b) for _ in range(20)]


def test_sample_only_returns_tokens_with_probability():
    gen = make_generator(0, CPU)
    probs = torch.tensor([0.0, 0.7, 0.0, 0.3])
    draws = {sample(probs, gen) for _ in range(200)}
    assert draws == {1, 3}


def test_sample_follows_its_distribution():
    """Pearson's chi-square over 20,000 draws from a skewed row with zeros at both ends (the 1e-4 critical value
    for 5 degrees of freedom is 25.7); one token shifted to its neighbour's slot fails it."""
    probs = torch.tensor([0.0, 0.02, 0.08, 0.4, 0.0, 0.25, 0.15, 0.1, 0.0])
    gen = make_generator(7, CPU)
    n = 20_000
    counts = torch.bincount(torch.tensor([sample(probs, gen) for _ in range(n)]), minlength=probs.numel()).double()
    live = probs > 0
    assert counts[~live].sum() == 0
    expected = probs[live].double() * n
    assert float(((counts[live] - expected) ** 2 / expected).sum()) < 25.7


def test_uniform_draws_lie_in_the_unit_interval():
    gen = make_generator(3, CPU)
    draws = [uniform(gen, CPU) for _ in range(100)]
    assert all(0.0 <= u < 1.0 for u in draws)
    assert len(set(draws)) > 90


def test_valid_sampling_params_normalise_stop_strings_to_a_tuple():
    assert SamplingParams(stop="###").stop == ("###",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams().greedy and not SamplingParams(temperature=0.7).greedy


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, "max_new_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": "0.7"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"seed": -3}, "seed"),
        ({"stop": ""}, "stop"),
        ({"stop": ("ok", "")}, "stop"),
    ],
)
def test_invalid_sampling_params_raise_config_error_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        SamplingParams(**kwargs)


def test_booleans_are_not_accepted_as_integer_settings():
    with pytest.raises(ConfigError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=True)
