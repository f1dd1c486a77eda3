"""Acceptance rules over a token tree.

Words, as in vLLM's rejection sampler: a drafted node is *accepted* if verification keeps it; the *bonus* token
is the one extra token the target always contributes after the last accepted node (drawn from the target, or,
after a rejection, from the *residual* distribution `normalize(max(p - q, 0))`).

Both rules are lossless. Greedy: the output equals plain greedy decoding. Stochastic: recursive rejection
sampling (SpecInfer) reproduces the target distribution exactly, for any proposal, as long as each node's
`draft_probs` row is the distribution that node's token was really drawn from, given its earlier siblings.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec import kernels
from specdec.errors import NumericalError
from specdec.sampling import sample, uniform
from specdec.tree.token_tree import TokenTree
from specdec.verifier.result import VerifyResult


def verify_greedy(tree: TokenTree, logits: Tensor) -> VerifyResult:
    """Longest root-to-node path whose every node is the target's argmax after its parent, plus the bonus."""
    return verify_greedy_batch([tree], [logits])[0]


def verify_stochastic(tree: TokenTree, probs: Tensor, generator: torch.Generator | None) -> VerifyResult:
    """Recursive rejection sampling. `probs [N, V]` is the processed target distribution after each node."""
    tokens = tree.tokens.tolist()
    node, path = 0, [0]
    while True:
        p = probs[node]
        accepted = None
        for child in tree.children[node]:
            token = tokens[child]
            q = _proposal(tree, child, token, p)
            ratio = float(p[token]) / max(float(q[token]), 1e-30)
            if uniform(generator, p.device) < min(1.0, ratio):
                accepted = child
                break
            residual = torch.clamp(p - q, min=0.0)
            total = float(residual.sum())
            if total <= 0.0:  # p == q on the support: nothing left to reject into (q was exact)
                break
            p = residual / total
        if accepted is None:
            bonus = sample(p, generator)
            return VerifyResult(path, [tokens[i] for i in path[1:]] + [bonus], bonus)
        node = accepted
        path.append(node)
        if not tree.children[node]:
            bonus = sample(probs[node], generator)
            return VerifyResult(path, [tokens[i] for i in path[1:]] + [bonus], bonus)


def _proposal(tree: TokenTree, node: int, token: int, like: Tensor) -> Tensor:
    """The distribution node `node` was drawn from; one-hot on its token when the drafter gave none."""
    if tree.draft_probs is not None:
        return tree.draft_probs[node].to(like.dtype)
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q


def verify_greedy_batch(trees: list[TokenTree], logits: list[Tensor]) -> list[VerifyResult]:
    """`verify_greedy` for many sequences at once: one argmax over all their rows, one host transfer. The argmax
    is -1 for a row holding NaN or +Inf: that stops the step with `NumericalError`, which makes this read the
    check of these rows (the engine skips its own pass over logits verified here, `Engine._check_finite`)."""
    if not trees:
        return []
    best_all = kernels.argmax_rows(logits[0] if len(logits) == 1 else torch.cat(logits)).tolist()
    if -1 in best_all:
        raise NumericalError.non_finite_logits()
    results, row = [], 0
    for tree in trees:
        n = len(tree)
        best = best_all[row: row + n]
        row += n
        tokens = tree.token_list
        node, path = 0, [0]
        while True:
            nxt = next((c for c in tree.children[node] if tokens[c] == best[node]), None)
            if nxt is None:
                break
            node = nxt
            path.append(node)
        emitted = [tokens[i] for i in path[1:]] + [best[node]]
        results.append(VerifyResult(accepted_nodes=path, tokens=emitted, bonus_token=best[node]))
    return results
