"""`medusa[:<path>]`: Medusa heads propose a tree from the target's last hidden state, at almost no cost.

Which hidden state. After a step the sequence ends with the bonus token, which the target's LM head produced from
the hidden state of the last accepted node (position t). That bonus token is the next tree's root (t + 1), and
Medusa head i at position t predicts token t + i + 2, so heads 0..K-1 fill depths 1..K below the root. After
prefill the same holds with t = the last prompt position and the first output token as the root. So the whole
per-sequence state is one vector: the feature of the last accepted node (`VerifyResult.hidden[-1]`), or of the
last prompt position. Rollback is free: each commit simply replaces it.

Trees. The heads' distributions do not depend on the parent (every head reads the same hidden state), so the
tree is a product of per-depth candidate lists: a static choice path `(r1, r2, ...)` is "rank r1 of head 0,
then rank r2 of head 1, ...". `dynamic:depth,topk,budget` keeps the `budget` paths of highest summed head
log-probability (best-first; a child never scores above its parent, so the result is a tree). Proposals are
deterministic top-k, which the verifier treats as one-hot proposals: lossless at any temperature.

Without a path, the heads shipped for the target are used (`specdec/assets/medusa/<alias>/`).
"""

from __future__ import annotations

import heapq
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

from specdec.drafters.base import DrafterContext
from specdec.drafters.heads.medusa_heads import MedusaHeads, load_heads, shipped_heads_dir
from specdec.drafters.registry import register, reject_unknown
from specdec.errors import ConfigError
from specdec.engine.sequence import Sequence
from specdec.tree.token_tree import TokenTree
from specdec.tree.spec import TreeSpec, parse_tree_spec
from specdec.verifier.result import VerifyResult

STATE_KEY = "medusa_hidden"
DEFAULT_TREE = "static:medusa-8"  # chosen by measured tok/s with the int8 target (see the shipped README)


class MedusaDrafter:
    name = "medusa"
    needs_hidden_states = True
    feature_layers: tuple[int, ...] = ()

    def __init__(self, heads: MedusaHeads) -> None:
        self.heads = heads

    def default_tree(self) -> TreeSpec:
        return parse_tree_spec(DEFAULT_TREE)

    # ------------------------------------------------------------------------------------------- state
    def start(self, seqs: list[Sequence]) -> None:
        pass  # the state arrives with the prompt's features (observe_prefill)

    def observe_prefill(self, seq: Sequence, start: int, features: Tensor) -> None:
        if features is not None and features.shape[0]:
            seq.drafter_state[STATE_KEY] = features[-1].detach().clone()

    def commit(self, seqs: list[Sequence], results: list[VerifyResult]) -> None:
        for seq, result in zip(seqs, results):
            if result.hidden is not None and result.hidden.shape[0]:
                seq.drafter_state[STATE_KEY] = result.hidden[-1].detach().clone()

    def release(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            seq.drafter_state.pop(STATE_KEY, None)

    # ----------------------------------------------------------------------------------------- propose
    @torch.no_grad()
    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        ready = [i for i, seq in enumerate(seqs) if STATE_KEY in seq.drafter_state]
        trees = [TokenTree.chain([seq.last_token]) for seq in seqs]
        depth = min(spec.depth, self.heads.num_heads)
        if not ready or depth == 0 or spec.budget == 0:
            return trees
        hidden = torch.stack([seqs[i].drafter_state[STATE_KEY] for i in ready])
        logp = torch.log_softmax(self.heads(hidden)[:, :depth].float(), dim=-1)  # [B, D, V], one call for all
        if spec.kind == "dynamic":
            top = logp.topk(min(spec.topk, logp.shape[-1]), dim=-1)
            values, indices = top.values.tolist(), top.indices.tolist()
            for row, i in enumerate(ready):
                trees[i] = best_first_tree(seqs[i].last_token, values[row], indices[row], spec.budget)
            return trees
        choices = spec.choices if spec.kind == "static" else _chain_spec(depth).choices
        layout = _static_layout(choices, depth, logp.shape[-1])
        if len(layout.depths) == 0:
            return trees
        width = int(layout.ranks.max()) + 1
        indices = logp.topk(width, dim=-1).indices  # [B, D, w]
        drafted = indices[:, layout.depths, layout.ranks].tolist()  # [B, n]
        for row, i in enumerate(ready):
            trees[i] = TokenTree.from_parents([seqs[i].last_token] + drafted[row], layout.parents)
        return trees


class _Layout:
    """A static tree as index arrays: node n (after the root) is rank `ranks[n]` of head `depths[n]`."""

    def __init__(self, parents: list[int], depths: list[int], ranks: list[int]) -> None:
        self.parents = parents  # [n + 1], root first
        self.depths = torch.tensor(depths, dtype=torch.int64)  # [n] head index (depth - 1)
        self.ranks = torch.tensor(ranks, dtype=torch.int64)  # [n]


@lru_cache(maxsize=32)
def _static_layout(choices: tuple[tuple[int, ...], ...], max_depth: int, vocab: int) -> _Layout:
    """Choice paths deeper than the heads reach (or ranking past the vocabulary) are dropped, with their
    subtrees."""
    index = {(): 0}
    parents, depths, ranks = [-1], [], []
    for path in sorted(choices, key=lambda c: (len(c), c)):
        if len(path) > max_depth or path[-1] >= vocab or path[:-1] not in index:
            continue
        index[path] = len(parents)
        parents.append(index[path[:-1]])
        depths.append(len(path) - 1)
        ranks.append(path[-1])
    return _Layout(parents, depths, ranks)


def _chain_spec(depth: int) -> TreeSpec:
    return TreeSpec("static", depth=depth, topk=1, budget=depth, choices=tuple((0,) * d for d in range(1, depth + 1)))


def best_first_tree(root: int, values: list[list[float]], tokens: list[list[int]], budget: int) -> TokenTree:
    """The `budget` highest-scoring paths, score = summed log-probs of the heads' choices along the path.

    `values[d][r]`, `tokens[d][r]`: rank r of head d, sorted best first. Expanding best-first from the root gives
    the optimal tree under the heads' independence: every child scores at most its parent.
    """
    out_tokens, parents = [root], [-1]
    heap: list[tuple[float, int, int, int]] = [(-values[0][0], 0, 0, 0)]  # (-score, parent node, depth, rank)
    while heap and len(out_tokens) - 1 < budget:
        neg, parent, d, r = heapq.heappop(heap)
        node = len(out_tokens)
        out_tokens.append(tokens[d][r])
        parents.append(parent)
        score = -neg
        if r + 1 < len(tokens[d]):  # next sibling
            heapq.heappush(heap, (-(score - values[d][r] + values[d][r + 1]), parent, d, r + 1))
        if d + 1 < len(tokens):  # first child
            heapq.heappush(heap, (-(score + values[d + 1][0]), node, d + 1, 0))
    return TokenTree.from_parents(out_tokens, parents)


@register("medusa")
def _build(args: dict[str, str], ctx: DrafterContext) -> MedusaDrafter:
    ref = args.pop("", None)
    reject_unknown("medusa", args)
    target = ctx.target.model
    if ref is None:
        shipped = shipped_heads_dir(ctx.target.source)
        if shipped is None:
            raise ConfigError(f"specdec ships no Medusa heads for target '{ctx.target.source}'; train some with "
                              "`specdec train medusa --target ... --out DIR` and use drafter 'medusa:DIR/heads'")
        ref = str(shipped)
    c = target.config
    heads = load_heads(Path(ref), c.hidden_size, c.vocab_size, target.lm_head, ctx.device,
                       torch.float32 if ctx.dtype == torch.float32 or ctx.quantize else ctx.dtype)
    return MedusaDrafter(heads)
