"""EAGLE-2's dynamic draft tree, grown one depth at a time from a drafter's top-k candidates.

Each depth, every frontier node offers its top-k tokens; a child scores its parent's cumulative draft
log-probability plus its own. Dynamic trees keep the `topk` best candidates of the whole depth as the next
frontier (EAGLE-2's expansion), and at the end keep the `budget` best nodes overall (its reranking): a child
never outscores its parent, so the kept nodes form a tree. Static trees keep the children the choice list
names (ranks per parent, Medusa-style). Growth stops early once no deeper node could make the final cut.

Nodes are drafted with top-k, i.e. deterministically: the verifier treats them as one-hot proposals, which
keeps verification lossless at any temperature.
"""

from __future__ import annotations

from torch import Tensor

from specdec.tree.token_tree import TokenTree
from specdec.tree.spec import TreeSpec


class TreeGrowth:
    """One sequence's tree while it grows: tokens, parents, cumulative log-probabilities, frontier."""

    def __init__(self, root: int, spec: TreeSpec) -> None:
        self.spec = spec
        self.tokens, self.parents, self.scores = [root], [-1], [0.0]
        self.paths: list[tuple[int, ...]] = [()]
        self.frontier = [0]
        self.done = spec.depth == 0
        self._choices = set(spec.choices)

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
                if self.spec.kind == "static" and self.paths[node] + (rank,) not in self._choices:
                    continue
                candidates.append((self.scores[node] + value, node, token, rank))
        if self.spec.kind != "static":
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
        if self.spec.kind == "static" or self.size < self.spec.budget:
            return False
        cutoff = sorted(self.scores[1:], reverse=True)[self.spec.budget - 1]
        return max(self.scores[i] for i in self.frontier) <= cutoff

    def tree(self) -> TokenTree:
        """The final tree: the `budget` best nodes (ties: the older node), parents before children."""
        if self.spec.kind == "static":
            keep = list(range(len(self.tokens)))
        else:
            order = sorted(range(1, len(self.tokens)), key=lambda i: (-self.scores[i], i))
            keep = [0] + sorted(order[: self.spec.budget])
        kept: set[int] = set()
        for i in keep:  # parents come first, so a node whose parent was cut is cut too
            if i == 0 or self.parents[i] in kept:
                kept.add(i)
        keep = sorted(kept)
        index = {old: new for new, old in enumerate(keep)}
        return TokenTree.from_parents([self.tokens[i] for i in keep],
                                      [-1] + [index[self.parents[i]] for i in keep[1:]])

    def feed_nodes(self) -> list[int]:
        """The drafted nodes (all but the root), in index order: what one draft forward re-feeds."""
        return list(range(1, len(self.tokens)))
