"""Logprobs are those of the processed distribution each token was drawn from."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.config import SamplingParams
from specdec.sampling import target_probs
from specdec.sampling.logprobs import token_logprobs


def test_greedy_logprobs_are_the_log_softmax_of_the_processed_logits():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    [lp] = token_logprobs(logits, [0], SamplingParams(logprobs=2))
    expected = torch.log_softmax(logits[0].double(), -1).tolist()
    assert lp.token_id == 0 and lp.logprob == pytest.approx(expected[0], abs=1e-6)
    assert [t for t, _ in lp.top] == [0, 1]
    assert [v for _, v in lp.top] == pytest.approx(expected[:2], abs=1e-6)


def test_sampled_logprobs_follow_temperature_and_cuts_and_leave_impossible_tokens_out():
    logits = torch.tensor([[2.0, 1.0, 0.0, -3.0]])
    params = SamplingParams(temperature=0.5, min_p=0.1, logprobs=4)
    [lp] = token_logprobs(logits, [1], params)
    probs = target_probs(logits, params)[0]
    assert lp.logprob == pytest.approx(math.log(float(probs[1])), abs=1e-6)
    assert len(lp.top) == int((probs > 0).sum()) < 4  # min_p cut the tail: those are not alternatives


def test_logprobs_zero_returns_the_chosen_token_only():
    [lp] = token_logprobs(torch.tensor([[0.0, 1.0]]), [1], SamplingParams(logprobs=0))
    assert lp.top == () and lp.logprob == pytest.approx(math.log(math.e / (1 + math.e)), abs=1e-6)


def test_min_p_keeps_tokens_at_least_min_p_times_the_best():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    out = target_probs(logits, SamplingParams(temperature=1.0, min_p=0.3))[0]
    assert (out > 0).tolist() == [True, True, True, False]
    assert out[:3].tolist() == pytest.approx((probs[0, :3] / probs[0, :3].sum()).tolist(), rel=1e-5)
