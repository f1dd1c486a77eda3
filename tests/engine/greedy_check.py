"""What the greedy-equivalence tests share: the prompts, the plain outputs, the comparison.

The drafter cases are split over two files (model-free drafters, trained drafters) so that pytest-xdist's
`--dist loadfile` can run them on both workers; one file held ten minutes of CI.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specdec.config import SamplingParams
from specdec.data import bench_prompts

NEW_TOKENS = 64


def greedy_prompts() -> list[str]:
    """One dev prompt per category (seven), copy-heavy ones among them, where drafts are accepted often."""
    by_category: dict[str, str] = {}
    for p in bench_prompts(split="dev"):
        by_category.setdefault(p["category"], p["prompt"])
    return list(by_category.values())


@pytest.fixture(scope="module")
def plain_outputs(default_llm):
    default_llm.use("none")
    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    prompts = greedy_prompts()
    return prompts, [o.token_ids for o in default_llm.generate(prompts, params)]


def assert_same_or_near_tie(llm, prompt: str, plain: list[int], spec: list[int]) -> None:
    if plain == spec:
        return
    first = next(i for i, (a, b) in enumerate(zip(plain, spec)) if a != b)
    ids = llm.encode(prompt) + plain[:first]
    llm.use("none")
    from specdec.engine.runner import Chunk, Rows
    from specdec.kvcache import BlockTable

    runner = llm.engine.runner
    table = BlockTable()
    logits = runner.run([Chunk(table, ids, list(range(len(ids))), None, Rows.LAST)])[0].logits[0]
    runner.cache.free(table)
    top2 = logits.topk(2).values
    gap = float(top2[0] - top2[1])
    assert gap < 1e-3, f"speculative output diverged at token {first} where the target is not near a tie (gap {gap})"


@pytest.fixture
def full_trees(default_llm):
    """Every step verifies the drafter's whole tree (no adaptive planner). The planner may rightly choose plain
    decode for a cold drafter at batch 7, and its measurements persist in the session's LLM, so with it the
    tau check below depended on which tests ran first (recycle's dynamic tree fell to tau 1.00 run alone)."""
    saved = default_llm.engine_config
    default_llm.engine_config = replace(saved, adaptive_speculation=False)
    yield default_llm
    default_llm.engine_config = saved
    default_llm.use("none")


def check_greedy_equivalence(llm, plain_outputs, drafter: str, tree: str) -> None:
    """Every prompt's speculative output equals plain greedy (or diverges only at a near-tie), some draft token
    is accepted, and every KV block is free afterwards."""
    prompts, plain = plain_outputs
    llm.use(drafter, tree)
    outs = llm.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    taus = [o.metrics.mean_accepted_tokens for o in outs]
    for prompt, base, out in zip(prompts, plain, outs):
        assert len(out.token_ids) == NEW_TOKENS
        assert_same_or_near_tie(llm, prompt, base, out.token_ids)
        llm.use(drafter, tree)
    assert sum(taus) / len(taus) > 1.0, "the drafter never got a token accepted; the test would prove nothing"
    cache = llm.engine.runner.cache
    assert cache.num_free_blocks == cache.pool.num_blocks
