"""Sampling with the model-free drafters (recycle, suffix, hybrid) must follow the target's distribution exactly.

The same goodness-of-fit design as test_lossless_sampling.py: a tiny target (vocab 16), 20k seeded requests of
three tokens, the joint distribution of tokens 2 and 3 (both from tree verification) against the exact one,
chi-square. These drafters' proposals change as they learn (the recycled matrix and the global suffix trie
grow with every request), so the runs also check that proposals which depend on earlier outputs stay
lossless. A planted bug, a drafter that claims its deterministic proposals were drawn from a distribution,
must fail the same test.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from specdec.config import SamplingParams
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.recycle import RecycleDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.engine.runner import Chunk, ModelRunner
from specdec.kvcache import BlockTable
from specdec.sampling import target_probs
from specdec.tree.spec import TreeSpec, chain
from specdec.tree.token_tree import TokenTree
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
    probs = target_probs(torch.cat([o.logits for o in runner.run(chunks)]), params).double()
    return torch.einsum("a,ab,abc->bc", probs[0], probs[1: 1 + VOCAB], probs[1 + VOCAB:].view(VOCAB, VOCAB, VOCAB))


def sampled_joint(model, drafter, tree: TreeSpec, params: SamplingParams) -> tuple[torch.Tensor, int]:
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
    return counts, sum(seq.metrics.accepted_drafts for seq in seqs)


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
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, vocab=VOCAB, sharpness=1.0)


TREE = TreeSpec("dynamic", depth=2, topk=2, budget=4)
DRAFTERS = {
    "recycle": lambda: RecycleDrafter(VOCAB, k=4),
    "suffix": lambda: SuffixDrafter(depth=8, factor=2.0, min_prob=0.0),
    "hybrid": lambda: HybridDrafter([("suffix", SuffixDrafter(depth=8, factor=2.0, min_prob=0.0)),
                                     ("recycle", RecycleDrafter(VOCAB, k=4))]),
}
PARAMS = {"T=1": SamplingParams(temperature=1.0), "T=0.7 top-p": SamplingParams(temperature=0.7, top_p=0.9)}


@pytest.mark.parametrize("params", list(PARAMS))
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_model_free_drafters_sample_the_target_distribution(target, name, params):
    counts, accepted = sampled_joint(target, DRAFTERS[name](), TREE if name != "suffix" else chain(2), PARAMS[params])
    assert accepted > RUNS // 10, "drafts were rarely accepted: the test would say little about verification"
    p = chi_square_p_value(counts, exact_joint(target, PARAMS[params]))
    assert p > 1e-3, f"{name} at {params}: sampled tokens do not follow the target (chi-square p={p:.2e})"


class ClaimsADistribution(RecycleDrafter):
    """The planted bug: deterministic proposals passed off as draws from a uniform distribution."""

    def propose(self, seqs, spec):
        trees = super().propose(seqs, spec)
        return [TokenTree(t.tokens, t.parents, torch.full((len(t), VOCAB), 1.0 / VOCAB)) for t in trees]


def test_planted_false_proposal_distribution_is_caught(target):
    params = PARAMS["T=1"]
    counts, _ = sampled_joint(target, ClaimsADistribution(VOCAB, k=4), TREE, params)
    p = chi_square_p_value(counts, exact_joint(target, params))
    assert p < 1e-3, f"a false proposal distribution passed the goodness-of-fit test (p={p:.3f})"
