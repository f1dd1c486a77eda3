"""Speculative sampling must follow the target's distribution exactly, whatever the draft proposes.

A tiny target (vocab 16) and a deliberately different tiny draft model. Each request's first generated token
comes from the prefill; the next two come from tree verification, so the joint distribution of tokens 2 and 3
is what speculation must get right. It is computed exactly from the target (every 1- and 2-token continuation),
and 20k seeded engine runs are compared against it with a chi-square test. A planted wrong acceptance rule
(min(1, q/p) instead of min(1, p/q)) must fail the same test, which shows the test has power.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from specdec.config import SamplingParams
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.config import EngineConfig
from specdec.kvcache import BlockTable
from specdec.engine.runner import Chunk, ModelRunner
from specdec.sampling import target_probs
from specdec.tree.spec import TreeSpec, chain
from specdec.verifier import rules
from tests.helpers import run_all, tiny_engine, tiny_model

VOCAB = 16
PROMPT = [3, 1, 4, 1, 5]
RUNS = 20000


def exact_joint(model, params: SamplingParams) -> torch.Tensor:
    """P(token2, token3) = sum over token1 of p(t1) p(t2 | t1) p(t3 | t1, t2), under `params`."""
    runner = ModelRunner.create(model, num_blocks=4096, block_size=16)
    contexts = [PROMPT] + [PROMPT + [a] for a in range(VOCAB)] + [
        PROMPT + [a, b] for a, b in itertools.product(range(VOCAB), repeat=2)]
    chunks = [Chunk(BlockTable(), c, list(range(len(c))), None, "last") for c in contexts]
    logits = torch.cat([o.logits for o in runner.run(chunks)])
    probs = target_probs(logits, params).double()
    p1 = probs[0]
    p2 = probs[1: 1 + VOCAB]  # [t1, t2]
    p3 = probs[1 + VOCAB:].view(VOCAB, VOCAB, VOCAB)  # [t1, t2, t3]
    return torch.einsum("a,ab,abc->bc", p1, p2, p3)


def sampled_joint(model, drafter, tree: TreeSpec, params: SamplingParams) -> torch.Tensor:
    engine = tiny_engine(model, drafter, tree, max_num_seqs=1024, max_num_batched_tokens=8192,
                         kv_cache_tokens=1024 * 48, block_size=8)
    seqs = [engine.add_request(PROMPT, SamplingParams(max_new_tokens=3, temperature=params.temperature,
                                                      top_p=params.top_p, seed=seed, ignore_eos=True))
            for seed in range(RUNS)]
    run_all(engine)
    counts = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    for seq in seqs:
        counts[seq.output_ids[1], seq.output_ids[2]] += 1
    assert engine.runner.cache.num_free_blocks == engine.runner.cache.pool.num_blocks
    return counts


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; cells expected below 5 are pooled into one."""
    expected = probs.flatten() * counts.sum()
    observed = counts.flatten()
    small = expected < 5
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    obs = torch.cat([observed[~small], observed[small].sum().view(1)])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2.0))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Thousands of tiny ops: one thread avoids OpenMP wake-up costs that dwarf the work itself."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models():
    return tiny_model(seed=0, vocab=VOCAB, sharpness=1.0), tiny_model(seed=7, vocab=VOCAB, sharpness=1.0)


def draft_drafter(draft_model):
    return DraftModelDrafter(draft_model, EngineConfig(max_num_seqs=1024, kv_cache_tokens=1024 * 48, block_size=8),
                             k=2)


CASES = {
    "T=1 draft chain": (SamplingParams(temperature=1.0), "draft", chain(2)),
    "T=0.7 top-p draft chain": (SamplingParams(temperature=0.7, top_p=0.9), "draft", chain(2)),
    "T=1 draft dynamic tree": (SamplingParams(temperature=1.0), "draft",
                               TreeSpec("dynamic", depth=2, topk=3, budget=6)),
    "T=0.7 top-p ngram tree": (SamplingParams(temperature=0.7, top_p=0.9), "ngram",
                               TreeSpec("dynamic", depth=2, topk=2, budget=4)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_matches_target_distribution(models, case):
    target, draft = models
    params, kind, tree = CASES[case]
    drafter = draft_drafter(draft) if kind == "draft" else NgramDrafter(n=1, k=2, branches=2)
    counts = sampled_joint(target, drafter, tree, params)
    p = chi_square_p_value(counts, exact_joint(target, params))
    assert p > 1e-3, f"{case}: sampled tokens do not follow the target distribution (chi-square p={p:.2e})"


def test_planted_wrong_acceptance_rule_is_caught(models, monkeypatch):
    """Accepting with min(1, q/p) biases the output toward the draft; the same test must reject it."""
    target, draft = models
    real_uniform = rules.uniform

    def wrong_rule(tree, probs, generator):
        # Run the real algorithm on a tree whose draft and target roles are swapped at acceptance time.
        swapped = rules.TokenTree(tree.tokens, tree.parents, probs.clone())
        flipped_probs = tree.draft_probs.clone()
        flipped_probs[0] = probs[0]
        return original(swapped, flipped_probs, generator)

    original = rules.verify_stochastic
    monkeypatch.setattr("specdec.engine.engine.verify_stochastic", wrong_rule)
    params = SamplingParams(temperature=1.0)
    counts = sampled_joint(target, draft_drafter(draft), chain(2), params)
    p = chi_square_p_value(counts, exact_joint(target, params))
    assert real_uniform is rules.uniform
    assert p < 1e-3, f"the planted rule min(1, q/p) passed the goodness-of-fit test (p={p:.3f})"
