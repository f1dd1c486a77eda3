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
    one_hot = tree.draft_probs is None
    node, path = 0, [0]
    while True:
        p = probs[node]
        accepted = None
        if one_hot:
            accepted, p = _one_hot_children(tree, node, tokens, p, generator)
        else:
            for child in tree.children[node]:
                token = tokens[child]
                q = tree.draft_probs[child].to(p.dtype)  # the distribution the child was drawn from
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


def _one_hot_children(tree: TokenTree, node: int, tokens: list[int], p: Tensor,
                      generator: torch.Generator | None) -> tuple[int | None, Tensor]:
    """The rule above for children each proposed with certainty (q one-hot), without a vector per child: a child
    is accepted with probability p(token) / (mass left), and a rejection only takes its token out of the
    residual (max(p - onehot, 0) is p with that entry 0). Returns the accepted child, or None and the residual
    to draw the bonus from (unnormalised: `sample` scales by its sum)."""
    mass = float(p.sum())
    rejected = []
    for child in tree.children[node]:
        token = tokens[child]
        share = float(p[token])
        if uniform(generator, p.device) < min(1.0, share / max(mass, 1e-30)):
            return child, p
        if mass - share <= 0.0:  # the token held all that was left (rounding): the residual stays as it was
            break
        rejected.append(token)
        mass -= share
    if not rejected:
        return None, p
    residual = p.clone()
    residual[torch.tensor(rejected, dtype=torch.int64, device=p.device)] = 0.0
    return None, residual


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
