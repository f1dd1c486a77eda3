"""The one tree builder: every drafter turns its scored candidates into a `TokenTree` here.

Two kinds of candidates exist, and each tree kind (chain, static, dynamic) is built from either:

* **Per-node candidates** (a draft model, EAGLE): each frontier node offers its own best tokens with
  log-probabilities. `TreeGrowth` grows the tree one depth at a time. A child scores its parent's cumulative
  log-probability plus its own. Dynamic trees keep the `topk` best candidates of the whole depth as the next
  frontier (EAGLE-2's expansion) and, at the end, the `budget` best nodes overall (its reranking): a child never
  outscores its parent, so the kept nodes form a tree. Static and chain trees keep the children their choice
  list names (ranks per parent, Medusa-style). Growth stops early once no deeper node could make the cut.
* **Per-depth candidates** (Medusa heads, where every depth's distribution ignores the parent):
  `per_depth_tree` lays a static/chain choice list over the ranked candidates of each depth, or, for dynamic
  trees, keeps the `budget` best paths by summed log-probability (best-first).
* **Candidate paths** (n-gram lookup, retrieval): `trie_tree` merges continuations into one trie, shared
  prefixes counted once, earlier paths first, under a node budget.

Proposals built here are deterministic (top-k, not sampled): the verifier treats them as one-hot, which keeps
verification lossless at any temperature. Adding a tree shape is one edit in this file.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from specdec.tree.spec import Choice, TreeKind, TreeSpec, choices_of
from specdec.tree.token_tree import TokenTree


class TreeGrowth:
    """One sequence's tree while it grows from per-node candidates: tokens, parents, scores, frontier."""

    def __init__(self, root: int, spec: TreeSpec) -> None:
        self.spec = spec
        self.tokens, self.parents, self.scores = [root], [-1], [0.0]
        self.paths: list[Choice] = [()]
        self.frontier = [0]
        self.done = spec.depth == 0
        self._dynamic = spec.kind is TreeKind.DYNAMIC
        self._choices = frozenset(choices_of(spec)) if not self._dynamic else frozenset()

    @property
    def size(self) -> int:
        return len(self.tokens) - 1

    def expand(self, top_logp: Tensor, top_ids: Tensor) -> None:
        """Add children under the frontier. `top_logp`/`top_ids` `[len(frontier), k]`: each frontier node's
        best tokens (target ids), best first."""
        values, ids = top_logp.tolist(), top_ids.tolist()
        candidates = []
        for row, node in enumerate(self.frontier):
            for rank, (value, token) in enumerate(zip(values[row], ids[row])):
                if not self._dynamic and self.paths[node] + (rank,) not in self._choices:
                    continue
                candidates.append((self.scores[node] + value, node, token, rank))
        if self._dynamic:
            candidates.sort(key=lambda c: -c[0])
            candidates = candidates[: self.spec.topk]
        self.frontier = []
        for score, parent, token, rank in candidates:
            self.frontier.append(len(self.tokens))
            self.tokens.append(token)
            self.parents.append(parent)
            self.scores.append(score)
            self.paths.append(self.paths[parent] + (rank,))
        depth = len(self.paths[-1]) if self.frontier else 0
        self.done = not self.frontier or depth >= self.spec.depth or self._cannot_improve()

    def _cannot_improve(self) -> bool:
        """Dynamic trees: no child of the frontier could enter the `budget` best nodes."""
        if not self._dynamic or self.size < self.spec.budget:
            return False
        cutoff = sorted(self.scores[1:], reverse=True)[self.spec.budget - 1]
        return max(self.scores[i] for i in self.frontier) <= cutoff

    def tree(self) -> TokenTree:
        """The final tree: the `budget` best nodes (ties: the older node), parents before children."""
        return self.scored_tree()[0]

    def scored_tree(self) -> tuple[TokenTree, list[float]]:
        """The final tree and each node's probability given its parent (root 0.0): the drafter's own claim that
        the node is accepted once its parent is, which a hybrid tree calibrates (`specdec.drafters.calibration`)."""
        if not self._dynamic:
            keep = list(range(len(self.tokens)))
        else:
            order = sorted(range(1, len(self.tokens)), key=lambda i: (-self.scores[i], i))
            keep = [0] + sorted(order[: self.spec.budget])
        order = _kept_nodes(self.parents, keep)
        probs = [0.0] + [math.exp(self.scores[i] - self.scores[self.parents[i]]) for i in order[1:]]
        return _reindexed(self.tokens, self.parents, order), probs

    def partial(self) -> TokenTree:
        """The tree so far (every node, the frontier included): what one draft forward re-feeds."""
        return TokenTree.from_parents(self.tokens, self.parents)


def subtree(tokens: list[int], parents: list[int], keep: list[int]) -> TokenTree:
    """The nodes `keep` (sorted, root first) as a tree; a node whose parent is not kept is dropped too."""
    return _reindexed(tokens, parents, _kept_nodes(parents, keep))


def _kept_nodes(parents: list[int], keep: list[int]) -> list[int]:
    """The nodes of `keep` (sorted, root first) whose every ancestor is kept too, in order."""
    kept: set[int] = set()
    for i in keep:
        if i == 0 or parents[i] in kept:
            kept.add(i)
    return sorted(kept)


def _reindexed(tokens: list[int], parents: list[int], order: list[int]) -> TokenTree:
    """The nodes `order` (a closed subtree, sorted, root first) as a tree of their own."""
    index = {old: new for new, old in enumerate(order)}
    return TokenTree.from_parents([tokens[i] for i in order], [-1] + [index[parents[i]] for i in order[1:]])


# ------------------------------------------------------------------------------------ per-depth candidates
@dataclass(frozen=True)
class ChoiceLayout:
    """A choice list as index arrays: node n + 1 is rank `ranks[n]` of the candidates at depth `depths[n] + 1`."""

    parents: list[int]  # [n + 1], root first
    depths: Tensor  # [n] int64, depth - 1
    ranks: Tensor  # [n] int64


@lru_cache(maxsize=64)
def choice_layout(choices: tuple[Choice, ...], max_depth: int, width: int) -> ChoiceLayout:
    """Choice paths deeper than `max_depth` or ranking past `width` candidates are dropped, with their subtrees."""
    index: dict[Choice, int] = {(): 0}
    parents, depths, ranks = [-1], [], []
    for path in sorted(choices, key=lambda c: (len(c), c)):
        if len(path) > max_depth or path[-1] >= width or path[:-1] not in index:
            continue
        index[path] = len(parents)
        parents.append(index[path[:-1]])
        depths.append(len(path) - 1)
        ranks.append(path[-1])
    return ChoiceLayout(parents, torch.tensor(depths, dtype=torch.int64), torch.tensor(ranks, dtype=torch.int64))


def per_depth_trees(roots: list[int], logp: Tensor, spec: TreeSpec, ids: Tensor | None = None) -> list[TokenTree]:
    """Trees from per-depth candidates, batched: `logp [B, D, V]` is each sequence's log-distribution at
    depths 1..D (independent of the parent). With `ids`, `logp` is over a reduced draft vocabulary and `ids[j]`
    is the target id of draft id j: ranking the few thousand draft ids and mapping the chosen ones costs less
    than scattering every row into the target's vocabulary to rank it there."""
    depth = min(spec.depth, logp.shape[1])
    if depth == 0 or spec.budget == 0:
        return [TokenTree.chain([root]) for root in roots]
    if spec.kind is TreeKind.DYNAMIC:
        top = logp[:, :depth].topk(min(spec.topk, logp.shape[-1]), dim=-1)
        chosen = top.indices if ids is None else ids[top.indices]
        values, indices = top.values.tolist(), chosen.tolist()
        return [best_first_tree(root, values[b], indices[b], spec.budget) for b, root in enumerate(roots)]
    layout = choice_layout(choices_of(spec), depth, logp.shape[-1])
    if len(layout.depths) == 0:
        return [TokenTree.chain([root]) for root in roots]
    width = int(layout.ranks.max()) + 1
    indices = logp[:, :depth].topk(width, dim=-1).indices  # [B, D, w]
    chosen = indices[:, layout.depths, layout.ranks]  # [B, n]
    drafted = (chosen if ids is None else ids[chosen]).tolist()
    return [TokenTree.from_parents([root] + drafted[b], layout.parents) for b, root in enumerate(roots)]


def best_first_tree(root: int, values: list[list[float]], tokens: list[list[int]], budget: int) -> TokenTree:
    """The `budget` highest-scoring paths, score = summed log-probs of each depth's choice along the path.

    `values[d][r]`, `tokens[d][r]`: rank r at depth d + 1, best first. Expanding best-first from the root gives
    the optimal tree when depths are independent: every child scores at most its parent.
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


# ------------------------------------------------------------------------------------------ candidate paths
def trie_tree(root: int, continuations: list[list[int]], budget: int) -> TokenTree:
    """Merge continuations into one tree under `budget` drafted nodes, earlier continuations first."""
    tokens, parents = [root], [-1]
    child_of: dict[tuple[int, int], int] = {}
    for follow in continuations:
        node = 0
        for token in follow:
            key = (node, token)
            if key not in child_of:
                if len(tokens) - 1 >= budget:
                    break
                child_of[key] = len(tokens)
                tokens.append(token)
                parents.append(node)
            node = child_of[key]
    return TokenTree.from_parents(tokens, parents)
