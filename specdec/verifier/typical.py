"""Typical acceptance (Medusa): accept what the target finds plausible enough. LOSSY, opt-in, sampled requests only.

A drafted child is accepted when the target, at its parent, gives it probability above

    min(threshold, alpha * exp(-entropy(p)))

so a confident target (low entropy) demands a likely token, and an uncertain one accepts any token above
`threshold`. The longest accepted root-to-node path wins (ties: highest summed log-probability), and the bonus
token is sampled from the target's distribution at its last node.

Why it is lossy: a token is kept because it is plausible, not with the probability the target would have
sampled it, so the output no longer follows the target's distribution (it leans towards the drafter's
choices, and never produces the low-probability tokens that sampling sometimes would). It trades exactness for
longer accepted runs at temperature > 0; `EngineConfig(acceptance="typical")` turns it on, lossless rejection
sampling stays the default, and greedy requests always use exact greedy verification.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from specdec.sampling import sample
from specdec.tree.token_tree import TokenTree
from specdec.verifier.result import VerifyResult


def typical_floor(probs: Tensor, threshold: float, alpha: float) -> Tensor:
    """[N, V] -> [N]: the probability a child must exceed under each node."""
    entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
    return torch.minimum(torch.full_like(entropy, threshold), alpha * torch.exp(-entropy))


def verify_typical(tree: TokenTree, probs: Tensor, generator: torch.Generator | None,
                   threshold: float, alpha: float) -> VerifyResult:
    """`probs [N, V]`: the processed target distribution after each node. Returns the accepted path + bonus."""
    floor = typical_floor(probs, threshold, alpha).tolist()
    tokens = tree.tokens.tolist()
    parents = tree.parent_list
    token_p = probs[tree.parents.clamp_min(0), tree.tokens].tolist()  # p(node's token | its parent)
    accepted = [True] + [False] * (len(tokens) - 1)
    score = [0.0] * len(tokens)
    depth = tree.depth.tolist()
    best = 0
    for node in range(1, len(tokens)):  # parents come first
        parent = parents[node]
        if accepted[parent] and token_p[node] > floor[parent]:
            accepted[node] = True
            score[node] = score[parent] + math.log(max(token_p[node], 1e-30))
            if (depth[node], score[node]) > (depth[best], score[best]):
                best = node
    path = [best]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    path.reverse()
    bonus = sample(probs[best], generator)
    return VerifyResult(path, [tokens[i] for i in path[1:]] + [bonus], bonus)
