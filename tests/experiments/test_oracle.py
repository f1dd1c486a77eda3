"""The oracle drafter proposes the target's own greedy continuation, corrupting each token with probability
1 - alpha, so under greedy verification every drafted node is accepted with probability alpha."""

from __future__ import annotations

import math

import pytest

from specdec.config import SamplingParams
from specdec.drafters.oracle import OracleDrafter, prepare_oracle
from specdec.errors import ConfigError
from specdec.experiments import measure_acceptance
from specdec.tree.spec import TreeKind
from tests.experiments.tiny import id_prompts


def plain_greedy(llm, prompts, params):
    llm.use("none")
    return [o.token_ids for o in llm.generate(prompts, params, chat=False)]


def test_alpha_one_reproduces_plain_greedy_and_accepts_every_node(tiny_llm):
    prompts = id_prompts(4)
    params = SamplingParams(max_new_tokens=30)
    plain = plain_greedy(tiny_llm, prompts, params)
    tiny_llm.use("oracle:alpha=1.0,k=4")
    tiny_llm.engine.planner = None  # the full tree every step
    prepare_oracle(tiny_llm, prompts, params.max_new_tokens, chat=False)
    outs = tiny_llm.generate(prompts, params, chat=False)
    assert [o.token_ids for o in outs] == plain
    assert all(o.metrics.accepted_per_step == [5] * len(o.metrics.accepted_per_step) for o in outs)
    assert tiny_llm.drafter._runner is None  # every proposal came from the prepared references


def test_without_prepare_the_target_itself_supplies_the_continuation(tiny_llm):
    prompts = id_prompts(3, start=40)
    params = SamplingParams(max_new_tokens=25)
    plain = plain_greedy(tiny_llm, prompts, params)
    tiny_llm.use("oracle:alpha=1.0,k=3")
    tiny_llm.engine.planner = None
    outs = tiny_llm.generate(prompts, params, chat=False)
    assert [o.token_ids for o in outs] == plain
    assert all(set(o.metrics.accepted_per_step) == {4} for o in outs)
    drafter = tiny_llm.drafter
    assert drafter._runner is not None
    cache = drafter._runner.cache  # the fallback ran, and gave back every block when the requests finished
    assert cache.num_free_blocks == cache.pool.num_blocks


def test_measured_acceptance_matches_alpha_within_binomial_error(tiny_llm):
    alpha = 0.6
    report = measure_acceptance(tiny_llm, id_prompts(16), SamplingParams(max_new_tokens=100),
                                drafter=f"oracle:alpha={alpha},k=4,seed=7", chat=False)
    offered, accepted = sum(report.stats.depth_offered), sum(report.stats.depth_accepted)
    assert offered > 1500
    sigma = math.sqrt(alpha * (1 - alpha) / offered)
    assert abs(accepted / offered - alpha) < 4 * sigma  # ~0.05: alpha = 0.5 or 0.7 would fail
    first = report.stats.depth_offered[0]
    assert abs(report.alpha_by_depth[0] - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / first)
    # and a different alpha is told apart
    low = measure_acceptance(tiny_llm, id_prompts(16), SamplingParams(max_new_tokens=100),
                             drafter="oracle:alpha=0.3,k=4,seed=7", chat=False)
    assert sum(low.stats.depth_accepted) / sum(low.stats.depth_offered) < accepted / offered - 0.15


@pytest.mark.parametrize("tree, nodes",
                         [("static:tree-8", 8), ("dynamic:depth=3,topk=3,budget=7", 7), ("chain:k=6", 6)])
def test_tree_shapes_are_filled_exactly_and_only_rank_zero_carries_the_oracle(tiny_llm, tree, nodes):
    report = measure_acceptance(tiny_llm, id_prompts(3), SamplingParams(max_new_tokens=20),
                                drafter="oracle:alpha=0.9", tree=tree, chat=False)
    assert report.stats.drafted_nodes == nodes * report.stats.steps
    for depth_row in report.acceptance_by_rank:
        assert all(p == 0.0 for p in depth_row[1:])  # fillers are never the target's greedy token


def test_sampled_requests_still_get_valid_trees(tiny_llm):
    params = SamplingParams(max_new_tokens=15, temperature=1.0, seed=3)
    tiny_llm.use("oracle:alpha=0.8,k=3", "static:tree-8")
    outs = tiny_llm.generate(id_prompts(3), params, chat=False)
    assert all(len(o.token_ids) == 15 for o in outs)


def test_cost_adds_draft_time_per_drafted_depth(tiny_llm):
    report = measure_acceptance(tiny_llm, id_prompts(1), SamplingParams(max_new_tokens=6),
                                drafter="oracle:alpha=0.5,k=2,cost=0.003", chat=False)
    assert report.stats.draft_time_s >= report.stats.steps * 2 * 0.003


@pytest.mark.parametrize("spec, message", [
    ("oracle", "alpha"), ("oracle:alpha=1.5", "between"), ("oracle:alpha=x", "number"),
    ("oracle:alpha=0.5,cost=-1", "between"), ("oracle:alpha=0.5,depth=3", "unknown"),
])
def test_bad_specs_say_what_is_wrong(tiny_llm, spec, message):
    with pytest.raises(ConfigError, match=message):
        tiny_llm.use(spec)


def test_the_oracle_is_registered_with_a_chain_default(tiny_llm):
    tiny_llm.use("oracle:alpha=0.5,k=7")
    assert isinstance(tiny_llm.drafter, OracleDrafter)
    assert tiny_llm.tree_spec.kind is TreeKind.CHAIN and tiny_llm.tree_spec.depth == 7
