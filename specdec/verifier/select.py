"""Which acceptance rule verifies a request, picked once when the request arrives.

Greedy requests use exact greedy verification, batched over every greedy sequence of a step (one argmax over
all their tree rows). Sampled requests use lossless recursive rejection sampling, or, when the engine is
configured for it, Medusa's typical acceptance (lossy, opt-in). The verifier never knows which drafter made a
tree.
"""

from __future__ import annotations

import enum
from typing import Callable

import torch
from torch import Tensor

from specdec.config import EngineConfig, SamplingParams
from specdec.sampling import target_probs
from specdec.tree.token_tree import TokenTree
from specdec.verifier.result import VerifyResult
from specdec.verifier.rules import verify_stochastic
from specdec.verifier.typical import verify_typical


class Rule(enum.Enum):
    GREEDY = "greedy"
    LOSSLESS = "lossless"
    TYPICAL = "typical"


def rule_for(params: SamplingParams, config: EngineConfig) -> Rule:
    if params.greedy:
        return Rule.GREEDY
    return Rule.TYPICAL if config.acceptance == "typical" else Rule.LOSSLESS


SampledRule = Callable[[TokenTree, Tensor, SamplingParams, torch.Generator], VerifyResult]


def sampled_rule(rule: Rule, config: EngineConfig) -> SampledRule:
    """The per-sequence verifier of a sampled rule, over the processed target distribution."""
    if rule is Rule.TYPICAL:
        threshold, alpha = config.typical_threshold, config.typical_alpha
        return lambda tree, logits, params, gen: verify_typical(tree, target_probs(logits, params), gen,
                                                                threshold, alpha)
    if rule is Rule.LOSSLESS:
        return lambda tree, logits, params, gen: verify_stochastic(tree, target_probs(logits, params), gen)
    raise ValueError(f"{rule} is not a sampled rule")
