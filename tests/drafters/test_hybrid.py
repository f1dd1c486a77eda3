"""The hybrid drafter through the engine: lossless greedy output, one budget over all parts, per-proposer
metrics, calibration fed by what the verifier accepted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.base import DrafterContext
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.none import NoDrafter
from specdec.drafters.registry import build_drafter
from specdec.errors import ConfigError
from specdec.tree.spec import TreeSpec, chain
from tests.helpers import ScriptedDrafter, run_all, tiny_engine, tiny_model

VOCAB = 24
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [9, 8, 7, 9, 8], [4, 4, 4, 4], [1, 2, 3, 4, 5, 1, 2, 3]]


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=9, vocab=VOCAB, sharpness=2.0)


def context(model) -> DrafterContext:
    return DrafterContext(SimpleNamespace(model=model, source="tiny"), EngineConfig(), torch.device("cpu"),
                          torch.float32, None)


def run(model, drafter, tree, prompts=PROMPTS):
    engine = tiny_engine(model, drafter, tree, adaptive_speculation=False)
    seqs = [engine.add_request(p, SamplingParams(max_new_tokens=40, ignore_eos=True)) for p in prompts]
    observed = []
    engine.step_observers.append(lambda seq, t, result: observed.append(t))
    run_all(engine)
    assert engine.runner.cache.num_free_blocks == engine.runner.cache.pool.num_blocks
    return seqs, observed


@pytest.mark.parametrize("spec", ["hybrid:suffix+recycle", "hybrid:ngram+recycle:k=4", "hybrid:suffix+ngram+recycle"])
@pytest.mark.parametrize("tree", [chain(4), TreeSpec("dynamic", depth=4, topk=3, budget=6)])
def test_hybrid_output_equals_plain_greedy_within_one_budget(model, spec, tree):
    plain, _ = run(model, NoDrafter(), chain(0))
    drafter = build_drafter(spec, context(model))
    seqs, trees = run(model, drafter, tree)
    assert [s.output_ids for s in seqs] == [s.output_ids for s in plain]
    assert all(len(t) - 1 <= tree.budget and int(t.depth.max()) <= tree.depth for t in trees)
    assert all(t.source is not None and (t.source[1:] > 0).all() for t in trees if len(t) > 1)
    accepted = sum(s.metrics.accepted_drafts for s in seqs)
    assert accepted > 0
    by_source = {}
    for s in seqs:
        for name, n in s.metrics.accepted_by_source.items():
            by_source[name] = by_source.get(name, 0) + n
        assert not s.drafter_state, "a finished request kept drafter state"
    assert sum(by_source.values()) == accepted
    assert set(by_source) <= set(drafter.source_names[1:])
    tried = sum(c[0] for c in drafter.calibration._counts.values())
    assert tried > 0, "the calibration never saw a verified node"


def test_calibration_moves_the_budget_to_the_part_the_verifier_accepts(model):
    plain, _ = run(model, NoDrafter(), chain(0))
    continuation = {i: s.output_ids for i, s in enumerate(plain)}
    liar = ScriptedDrafter("liar", continuation, offset=1, score=0.9, vocab=VOCAB)  # confident and always wrong
    good = ScriptedDrafter("good", continuation, offset=0, score=0.3, vocab=VOCAB)  # modest and always right
    drafter = HybridDrafter([("liar", liar), ("good", good)])
    before = drafter.calibration.estimate(1, 1, 0.9), drafter.calibration.estimate(2, 1, 0.3)
    seqs, trees = run(model, drafter, TreeSpec("dynamic", depth=2, topk=2, budget=2))
    after = drafter.calibration.estimate(1, 1, 0.9), drafter.calibration.estimate(2, 1, 0.3)
    assert after[0] < before[0] - 0.3 and after[1] > before[1] + 0.3
    # with a budget of 2, the first trees hold the liar's confident chain; once calibrated, the good one's
    assert trees[0].source[1:].tolist() == [1, 1] and trees[-1].source[1:].tolist() == [2, 2]
    assert sum(s.metrics.accepted_by_source.get("good", 0) for s in seqs) > 0
    assert all(s.output_ids == p.output_ids for s, p in zip(seqs, plain))


def test_bad_hybrid_specs_are_refused(model):
    ctx = context(model)
    for spec in ["hybrid:suffix", "hybrid:recycle+recycle", "hybrid:suffix+hybrid:ngram+recycle",
                 "hybrid:suffix+nonsense"]:
        with pytest.raises(ConfigError):
            build_drafter(spec, ctx)
    assert isinstance(build_drafter("hybrid:suffix:min_prob=0.2+recycle:k=4", ctx), HybridDrafter)


def test_the_hybrids_own_min_prob_option(model):
    """`+min_prob=P` is the hybrid's (a segment whose name holds "="), checked like any option; 0 without it."""
    ctx = context(model)
    assert build_drafter("hybrid:suffix+recycle+min_prob=0.3", ctx).min_prob == 0.3
    assert build_drafter("hybrid:suffix:min_prob=0.2+recycle", ctx).min_prob == 0.0  # suffix's own option
    assert build_drafter("hybrid:suffix+recycle", ctx).min_prob == 0.0
    for spec, match in [("hybrid:suffix+recycle+min_prob=2", "min_prob"), ("hybrid:suffix+recycle+min_prob=x", "min_prob"),
                        ("hybrid:suffix+recycle+min_prob=0.1+min_prob=0.2", "twice"),
                        ("hybrid:suffix+recycle+budget=3", "unknown hybrid option")]:
        with pytest.raises(ConfigError, match=match):
            build_drafter(spec, ctx)


def test_nodes_below_min_prob_stay_out_of_the_tree(model):
    """A part whose nodes are estimated below `min_prob` (and always wrong) gets a few explored (the cut's
    optimism), then none, though the budget has room for them; with `min_prob` 0 they fill that room every
    step. The output is the target's either way."""
    plain, _ = run(model, NoDrafter(), chain(0))
    continuation = {i: s.output_ids for i, s in enumerate(plain)}

    def parts():
        return [("sure", ScriptedDrafter("sure", continuation, offset=0, score=0.9, vocab=VOCAB)),
                ("doubtful", ScriptedDrafter("doubtful", continuation, offset=1, score=0.05, vocab=VOCAB))]

    def doubtful_nodes(trees):
        return [int((t.source[1:] & 2).bool().sum()) if len(t) > 1 else 0 for t in trees]

    tree = TreeSpec("dynamic", depth=2, topk=2, budget=4)
    cut = HybridDrafter(parts(), min_prob=0.2)
    assert cut.calibration.optimism > 0
    seqs, trees = run(model, cut, tree)
    assert [s.output_ids for s in seqs] == [s.output_ids for s in plain]
    late = doubtful_nodes(trees)[len(trees) // 2:]
    assert late and sum(late) == 0, "nodes rated below the cut were still verified after they had been tried"
    uncut, trees_uncut = run(model, HybridDrafter(parts(), min_prob=0.0), tree)
    assert [s.output_ids for s in uncut] == [s.output_ids for s in plain]
    assert sum(doubtful_nodes(trees_uncut)) > 4 * max(1, sum(doubtful_nodes(trees)))


def test_a_part_with_a_depth_cap_drafts_no_deeper(model):
    """`depth=N` on a part (kept by the hybrid, not passed to the part): its nodes stop at depth N, the other
    part fills the deeper levels, and the output is still the target's."""
    ctx = context(model)
    hybrid = build_drafter("hybrid:suffix+recycle:seed=5,depth=2", ctx)
    assert hybrid.depths == [None, 2] and dict(hybrid.parts)["recycle"].prefill_logit_rows == 5
    for spec in ["hybrid:suffix+recycle:depth=0", "hybrid:suffix+recycle:depth=x", "hybrid:suffix:depth=1,depth=2+recycle"]:
        with pytest.raises(ConfigError, match="depth"):
            build_drafter(spec, ctx)
    plain, _ = run(model, NoDrafter(), chain(0))
    continuation = {i: s.output_ids for i, s in enumerate(plain)}
    deep = ScriptedDrafter("deep", continuation, offset=0, score=0.5, vocab=VOCAB)
    capped = ScriptedDrafter("capped", continuation, offset=1, score=0.9, vocab=VOCAB)
    seqs, trees = run(model, HybridDrafter([("deep", deep), ("capped", capped)], [None, 1]),
                      TreeSpec("dynamic", depth=4, topk=2, budget=6))
    assert [s.output_ids for s in seqs] == [s.output_ids for s in plain]
    assert any(int(t.depth.max()) > 1 for t in trees)
    for t in trees:
        assert not ((t.source & 2).bool() & (t.depth > 1)).any(), "the capped part drafted below its depth"
    assert any(((t.source & 2).bool() & (t.depth == 1)).any() for t in trees)


def test_recycle_inside_a_hybrid_takes_no_prompt_seeds_unless_asked(model):
    """`seed=0` is recycle's default inside a hybrid (PART_DEFAULTS); its own option still wins."""
    ctx = context(model)
    parts = dict(build_drafter("hybrid:suffix+recycle", ctx).parts)
    assert parts["recycle"].prefill_logit_rows == 0
    hybrid = build_drafter("hybrid:suffix+recycle:k=4,seed=5", ctx)
    assert dict(hybrid.parts)["recycle"].prefill_logit_rows == 5 and hybrid.prefill_logit_rows == 5
    assert build_drafter("recycle", ctx).prefill_logit_rows == 16  # alone: its own default


def test_the_default_tree_follows_the_price_of_a_verified_row(model, monkeypatch):
    """A chain of 3 where every verified row costs (AVX2), a 4-node tree where the int8 linears take a few rows
    for little more than one (VNNI blocks), the 6-node tree where they are flat (AMX)."""
    from specdec.drafters import hybrid
    from specdec.kernels import cpu

    drafter = build_drafter("hybrid:suffix+recycle", context(model))
    monkeypatch.setattr(cpu, "flat_verified_rows", lambda: False)
    monkeypatch.setattr(cpu, "blocked_weights", lambda: False)
    assert drafter.default_tree() == chain(3)
    monkeypatch.setattr(cpu, "blocked_weights", lambda: True)
    assert drafter.default_tree() == hybrid.VNNI_ROWS_TREE != chain(3)
    monkeypatch.setattr(cpu, "flat_verified_rows", lambda: True)
    assert drafter.default_tree() == hybrid.FLAT_ROWS_TREE
