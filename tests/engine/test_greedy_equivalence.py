"""Greedy speculative decoding must emit exactly what plain greedy decoding emits, on the real default model.

fp32 rounding can, in principle, flip an argmax where the top two logits are nearly tied, because a tree
verification computes the same row in a different batch shape. The test never loosens the comparison: where
outputs diverge, it requires the divergence to be at such a near-tie (top-2 logit gap below 1e-3).
"""

from __future__ import annotations

import pytest
import torch

from specdec.config import SamplingParams
from tests.engine.greedy_check import check_greedy_equivalence, full_trees, greedy_prompts, plain_outputs  # noqa: F401
from tests.helpers import skip_unless_ci

# Drafters without trained weights; the trained ones are in test_greedy_equivalence_trained.py.
CONFIGS = [
    ("ngram", "chain:k=5"),
    ("ngram:branches=4", "dynamic:depth=5,topk=4,budget=16"),
    ("recycle", "chain:k=4"),
    ("recycle", "dynamic:depth=6,topk=4,budget=8"),
    ("suffix", "chain:k=6"),
    ("hybrid:suffix+recycle", "dynamic:depth=6,topk=4,budget=8"),
]


@pytest.mark.parametrize("drafter,tree", CONFIGS)
def test_speculative_greedy_equals_plain_greedy(full_trees, plain_outputs, drafter, tree):  # noqa: F811
    check_greedy_equivalence(full_trees, plain_outputs, drafter, tree)


def test_plain_decode_equals_transformers_generate(default_llm, hf_default_model):
    default_llm.use("none")
    tok = default_llm.tokenizer
    prompts = ["Write a short story about a robot who learns to paint.", "Explain how photosynthesis works.",
               "Describe the water cycle step by step."]
    outs = default_llm.generate(prompts, SamplingParams(max_new_tokens=32))  # both stop at EOS or 32 tokens
    for prompt, out in zip(prompts, outs):
        ids = default_llm.encode(prompt)
        with torch.no_grad():
            ref = hf_default_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                                            pad_token_id=tok.eos_token_id)
        assert out.token_ids == ref[0, len(ids):].tolist(), prompt
    assert sum(len(o.token_ids) for o in outs) >= 80, "answers too short to compare decoding"


@pytest.fixture(scope="module")
def int8_llm():
    """A separate int8 copy of the default model (quantization replaces the linears in place)."""
    from specdec.api import LLM
    from specdec.errors import OfflineError

    try:
        return LLM("smollm2-135m", quantize="int8", show_progress=False, num_threads=1)
    except OfflineError as exc:
        skip_unless_ci(f"default model unavailable offline: {exc}")


def test_int8_greedy_is_the_same_batched_alone_and_speculative(int8_llm):
    """int8 activations amplify rounding noise into different tokens, so here nothing is excused as a near-tie:
    with float64 attention every path must give exactly the plain, one-request-at-a-time output."""
    prompts = greedy_prompts()[:6]
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    int8_llm.use("none")
    alone = [int8_llm.generate([p], params)[0].token_ids for p in prompts]
    assert [o.token_ids for o in int8_llm.generate(prompts, params)] == alone
    taus = []
    for drafter, tree in [("ngram", "chain:k=5"), ("draft", "dynamic:depth=4,topk=4,budget=12"), ("recycle", None),
                          ("suffix", None), ("hybrid:suffix+recycle", None), ("eagle:vocab=4096", None),
                          ("medusa:vocab=4096", None), ("draft:vocab=4096", "chain:k=4"),
                          ("draft:smollm2-135m,quantize=int4", "chain:k=4")]:  # a separate int4 draft model
        int8_llm.use(drafter, tree)
        outs = int8_llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == alone, drafter
        taus += [o.metrics.mean_accepted_tokens for o in outs]
    assert max(taus) > 1.0, "no draft token was ever accepted; the comparison would prove nothing"


def test_int7_greedy_is_the_same_batched_alone_and_speculative():
    """int7 (7-bit weights, int8 activations) sums its products another way on AVX2 (w + 64 unsigned): with it,
    too, trees of several rows (the kernel's threes, pairs and lone rows) give exactly plain greedy output."""
    from specdec.api import LLM
    from specdec.errors import OfflineError

    try:
        llm = LLM("smollm2-135m", quantize="int7", show_progress=False, num_threads=1)
    except OfflineError as exc:
        skip_unless_ci(f"default model unavailable offline: {exc}")
    assert llm.model.lm_head.bits == 7 and llm.model.layers[0].mlp.down_proj.bits == 7
    prompts = greedy_prompts()[:4]
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    alone = [llm.generate([p], params)[0].token_ids for p in prompts]
    assert [o.token_ids for o in llm.generate(prompts, params)] == alone
    taus = []
    for drafter, tree in [("hybrid:suffix+recycle", "dynamic:depth=4,topk=3,budget=7"), ("ngram", "chain:k=5")]:
        llm.use(drafter, tree)
        outs = llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == alone, drafter
        taus += [o.metrics.mean_accepted_tokens for o in outs]
    assert max(taus) > 1.0, "no draft token was ever accepted; the comparison would prove nothing"
