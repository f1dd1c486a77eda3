"""Node planning: lookup drafters draft for every sequence, the planner verifies only the nodes that pay.

Greedy outputs never depend on the plan (greedy equivalence on the default model covers suffix, ngram and
recycle with it); these tests check that the engine feeds the calibration what the verifier accepted, that a
drafter whose nodes are never accepted stops being consulted, and that a node plan never changes tokens.
"""

from __future__ import annotations

import pytest

from specdec.config import SamplingParams
from specdec.drafters.none import NoDrafter
from specdec.engine.planner import GAIN_EVIDENCE
from specdec.tree.spec import chain
from specdec.tree.token_tree import TokenTree
from tests.helpers import ScriptedDrafter, StepClock, run_all, tiny_engine, tiny_model

VOCAB = 16


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=5, vocab=VOCAB, sharpness=3.0)


PARAMS = SamplingParams(max_new_tokens=40, ignore_eos=True)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]


def generate(model, drafter, tree, monkeypatch):
    engine = tiny_engine(model, drafter, tree, kv_cache_tokens=1024, block_size=4)
    StepClock().install(engine, monkeypatch)  # plans that do not depend on how busy the machine is
    seqs = [engine.add_request(p, PARAMS) for p in PROMPTS]
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return engine, [s.output_ids for s in seqs], steps


def plain_continuations(model, monkeypatch) -> tuple[dict[int, list[int]], list[list[int]]]:
    _, outputs, _ = generate(model, NoDrafter(), chain(0), monkeypatch)
    return dict(enumerate(outputs)), outputs


def test_right_drafts_are_verified_and_calibrated_up(model, monkeypatch):
    continuation, plain = plain_continuations(model, monkeypatch)
    drafter = ScriptedDrafter("right", continuation, offset=0, score=0.3, vocab=VOCAB, plans_by_node=True)
    engine, outputs, steps = generate(model, drafter, chain(3), monkeypatch)
    assert outputs == plain
    calibration = engine.planner.calibration
    tried, accepted = calibration.observed(1, 1, 0.3)
    assert tried > 0 and accepted == tried  # every verified first node was right, and the engine said so
    assert calibration.estimate(1, 1, 0.3) > 0.3 + 0.3  # up from the drafter's modest claim
    assert steps < 0.75 * len(plain[0])  # more than one token a step: the plan verified the drafts


def test_a_drafter_whose_nodes_are_never_accepted_stops_being_consulted(model, monkeypatch):
    continuation, plain = plain_continuations(model, monkeypatch)
    drafter = ScriptedDrafter("liar", continuation, offset=1, score=0.9, vocab=VOCAB, plans_by_node=True)
    engine, outputs, steps = generate(model, drafter, chain(3), monkeypatch)
    assert outputs == plain
    assert engine.planner.calibration.estimate(1, 1, 0.9) < 0.9 - 0.2  # down from the drafter's claim
    # drafting is skipped once its gain is measured at nothing, and retried after EXPLORE_AFTER steps (then
    # after twice as many each time it wins nothing)
    assert drafter.proposals < steps / 3
    assert drafter.proposals >= GAIN_EVIDENCE + 1


def test_node_planning_is_an_opt_in_option_of_the_lookup_drafters():
    from types import SimpleNamespace

    from specdec.drafters.registry import build_drafter
    from specdec.errors import ConfigError

    # a target with no alias: recycle's warm=default finds no shipped matrix and starts empty
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=VOCAB))
    ctx = SimpleNamespace(target=SimpleNamespace(source="dummy:stub", model=model))
    for name in ("suffix", "ngram", "recycle"):
        assert not build_drafter(name, ctx).plans_by_node
        assert build_drafter(f"{name}:nodes=1", ctx).plans_by_node
        with pytest.raises(ConfigError, match="nodes"):
            build_drafter(f"{name}:nodes=2", ctx)


@pytest.mark.parametrize("name", ["suffix", "ngram", "recycle"])
def test_real_lookup_drafters_with_node_planning_give_plain_greedy_output(model, name, monkeypatch):
    from specdec.drafters.ngram import NgramDrafter
    from specdec.drafters.recycle import RecycleDrafter
    from specdec.drafters.suffix import SuffixDrafter

    drafter = {"suffix": lambda: SuffixDrafter(), "ngram": lambda: NgramDrafter(n=2, k=4),
               "recycle": lambda: RecycleDrafter(VOCAB, k=4)}[name]()
    drafter.plans_by_node = True
    _, plain = plain_continuations(model, monkeypatch)
    engine, outputs, _ = generate(model, drafter, chain(4), monkeypatch)
    assert outputs == plain
    tried = sum(c[0] for c in engine.planner.calibration._counts.values())
    assert tried > 0, "the calibration never saw a verified node"


def test_a_seeded_sampled_request_verifies_its_drafters_own_tree(model):
    """A pinned request's tree is the drafter's proposal as made (ranking and cutting would make its shape, so
    its random draws, depend on what the calibration learnt from other requests); the others are ranked."""
    from specdec.drafters.base import DrafterBase
    from specdec.drafters.hybrid_merge import ScoredTree

    class TwoFaced(DrafterBase):
        plans_by_node = True

        def default_tree(self):
            return chain(3)

        def propose(self, seqs, spec):
            return [TokenTree.chain([s.last_token, 1, 2, 3]) for s in seqs]

        def propose_scored(self, seqs, spec):
            return [ScoredTree([s.last_token, 4, 5], [-1, 0, 1], [0.0, 0.9, 0.9]) for s in seqs]

    engine = tiny_engine(model, TwoFaced(), chain(3), kv_cache_tokens=1024, block_size=4)
    seen: dict[int, list[list[int]]] = {}
    engine.step_observers.append(lambda seq, tree, result: seen.setdefault(seq.seq_id, []).append(tree.token_list[1:]))
    pinned = engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=8, temperature=1.0, seed=7, ignore_eos=True))
    free = engine.add_request([4, 5, 6], SamplingParams(max_new_tokens=8, ignore_eos=True))
    run_all(engine)
    assert seen[pinned.seq_id] and all(t == [1, 2, 3] for t in seen[pinned.seq_id])
    assert seen[free.seq_id] and all(t == [4, 5][: len(t)] for t in seen[free.seq_id])
