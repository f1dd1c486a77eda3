"""Typical acceptance (Medusa): plausible children are kept, implausible ones are not, the longest accepted path
wins, and, unlike rejection sampling, the output does NOT follow the target's distribution (it is lossy)."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.medusa import MedusaDrafter
from specdec.drafters.heads.medusa_heads import MedusaHeads
from specdec.tree.token_tree import TokenTree
from specdec.tree.spec import chain, parse_tree_spec
from specdec.verifier.typical import typical_floor, verify_typical
from tests.helpers import run_all, tiny_engine, tiny_model

V = 6


def dist(*pairs: tuple[int, float]) -> torch.Tensor:
    """A distribution over V tokens with the given masses, the rest spread evenly."""
    p = torch.zeros(V)
    for token, mass in pairs:
        p[token] = mass
    rest = [t for t in range(V) if t not in dict(pairs)]
    p[rest] = (1 - p.sum()) / len(rest)
    return p


def test_floor_is_the_smaller_of_threshold_and_alpha_times_exp_minus_entropy():
    uniform = torch.full((1, V), 1 / V)
    assert typical_floor(uniform, 0.09, 0.3).item() == pytest.approx(min(0.09, 0.3 / V), rel=1e-5)
    peaked = dist((2, 0.95))[None]
    entropy = -(peaked * peaked.log()).sum().item()
    assert typical_floor(peaked, 0.09, 0.3).item() == pytest.approx(min(0.09, 0.3 * math.exp(-entropy)), rel=1e-5)


def test_accepts_a_likely_child_and_samples_the_bonus_after_it():
    tree = TokenTree.chain([0, 3])
    probs = torch.stack([dist((3, 0.9)), dist((4, 1.0))])
    result = verify_typical(tree, probs, torch.Generator().manual_seed(0), threshold=0.09, alpha=0.3)
    assert result.accepted_nodes == [0, 1]
    assert result.tokens == [3, 4] and result.bonus_token == 4


def test_rejects_an_unlikely_child():
    tree = TokenTree.chain([0, 3])
    probs = torch.stack([dist((1, 0.95), (3, 0.01)), dist((4, 1.0))])
    result = verify_typical(tree, probs, torch.Generator().manual_seed(0), threshold=0.09, alpha=0.3)
    assert result.accepted_nodes == [0]
    assert result.tokens == [result.bonus_token]


def test_threshold_zero_accepts_every_possible_child_and_one_accepts_only_the_confident():
    tree = TokenTree.chain([0, 3, 5])
    probs = torch.stack([dist((3, 0.05)), dist((5, 0.05)), dist((1, 1.0))])
    gen = torch.Generator().manual_seed(0)
    assert verify_typical(tree, probs, gen, threshold=0.0, alpha=0.3).accepted_nodes == [0, 1, 2]
    assert verify_typical(tree, probs, gen, threshold=1.0, alpha=1.0).accepted_nodes == [0]


def test_longest_accepted_path_wins_then_the_most_likely():
    #        root
    #       /    \
    #     1(.5)   2(.4)
    #      |       |
    #     3(.01)  4(.6)      -> branch 2-4 is accepted deeper
    tree = TokenTree.from_parents([0, 1, 2, 3, 4], [-1, 0, 0, 1, 2])
    probs = torch.stack([dist((1, 0.5), (2, 0.4)), dist((3, 0.01), (0, 0.9)), dist((4, 0.6)), dist((0, 1.0)),
                         dist((0, 1.0))])
    result = verify_typical(tree, probs, torch.Generator().manual_seed(0), 0.09, 0.3)
    assert result.accepted_nodes == [0, 2, 4]
    # equal depth: the likelier child
    tree = TokenTree.from_parents([0, 1, 2], [-1, 0, 0])
    probs = torch.stack([dist((1, 0.3), (2, 0.6)), dist((0, 1.0)), dist((0, 1.0))])
    assert verify_typical(tree, probs, torch.Generator().manual_seed(0), 0.09, 0.3).accepted_nodes == [0, 2]


def test_it_is_lossy_the_output_leans_to_the_draft():
    """The target samples token 2 with probability 0.2, but a drafter that always proposes it gets it accepted
    every time: exactly the bias that lossless rejection sampling exists to prevent."""
    p = torch.tensor([0.5, 0.3, 0.2, 0.0, 0.0, 0.0])
    tree = TokenTree.chain([0, 2])
    probs = torch.stack([p, p])
    gen = torch.Generator().manual_seed(0)
    first = [verify_typical(tree, probs, gen, 0.09, 0.3).tokens[0] for _ in range(200)]
    assert first.count(2) == 200


def test_engine_uses_typical_acceptance_only_for_sampled_requests():
    model = tiny_model(4, sharpness=3.0)
    c = model.config
    heads = MedusaHeads(2, 1, c.hidden_size, c.vocab_size, model.lm_head)
    spec = parse_tree_spec("static:medusa-8")
    greedy = SamplingParams(max_new_tokens=12)
    plain = tiny_engine(model, MedusaDrafter(heads), spec, adaptive_speculation=False)
    ref = plain.add_request([1, 2, 3], greedy)
    run_all(plain)
    typical = tiny_engine(model, MedusaDrafter(heads), spec, acceptance="typical", adaptive_speculation=False)
    same = typical.add_request([1, 2, 3], greedy)
    sampled = typical.add_request([1, 2, 3], SamplingParams(max_new_tokens=12, temperature=1.0, seed=1))
    run_all(typical)
    assert same.output_ids == ref.output_ids
    assert len(sampled.output_ids) == 12


def test_engine_applies_typical_acceptance_to_sampled_requests():
    """With threshold 0 every drafted token the target can produce is plausible, so typical acceptance keeps
    whole chains, which lossless rejection sampling of an unrelated draft cannot: the two accept rates must
    differ, or the engine is not using the rule it was configured with."""
    target, draft = tiny_model(4, sharpness=1.0), tiny_model(9, sharpness=1.0)
    rates = {}
    for acceptance in ("lossless", "typical"):
        config = dict(acceptance=acceptance, typical_threshold=0.0, adaptive_speculation=False)
        engine = tiny_engine(target, DraftModelDrafter(draft, EngineConfig(**config), k=3), chain(3), **config)
        seqs = [engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=12, temperature=1.0, seed=s,
                                                             ignore_eos=True)) for s in range(8)]
        run_all(engine)
        steps = sum(len(s.metrics.step_accepts) for s in seqs)
        rates[acceptance] = sum(s.metrics.accepted_drafts for s in seqs) / (3 * steps)
    assert rates["typical"] == 1.0, f"typical acceptance with threshold 0 rejected drafts: {rates}"
    assert rates["lossless"] < 0.8, f"the draft is too close to the target for this test: {rates}"
