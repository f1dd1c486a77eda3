"""Stochastic trees: each node's children drawn without replacement from the drafter's own distribution.

A one-hot tree (top-k children) treats every drafted token as certain, so at T > 0 a child is accepted only with
probability p(token), and a rejected sibling leaves the residual close to p. Children drawn from the drafter's
q, with q passed on, are accepted with probability min(1, p/q) each, and the verifier's recursive rejection
sampling (`specdec.verifier.rules.verify_stochastic`) stays exact when each child's row is the distribution it
was really drawn from: q with its earlier siblings removed, renormalised (sampling without replacement, as in
SpecInfer's multi-draft rule and Jeon et al.'s recursive speculative decoding).

What keeps it exact is the shape rule: how many children a node gets is fixed before they are drawn (by the
spec, the node's path and what was drawn before it), never by their own values, and no node is dropped
afterwards for its score (a dynamic tree's keep-the-best-`budget` step would bias the draws). Given everything
drawn so far, a node's children are then a fresh without-replacement sample from its q, and the rejection rule
at that node returns a token distributed as p whatever their number. So a dynamic spec gives each depth an
equal share of the budget (at most `topk` nodes) and hands it, before drawing, to the (node, rank) pairs with
the highest path score (the product of q along the path) times the rank-th largest q of the node (`allocate`:
confident paths go wide or deep, unlikely ones get nothing, as an EAGLE-2 tree does); `sampled-fixed` keeps
fixed widths per depth instead (`sampled_widths`). A static spec keeps its shape exactly; only a drafter that
runs out of tokens with probability > 0 draws fewer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec.sampling.distribution import sample
from specdec.tree.spec import Choice, TreeKind, TreeSpec, choices_of
from specdec.tree.token_tree import TokenTree


def sampled_widths(spec: TreeSpec) -> tuple[int, ...]:
    """Children per node at each depth for a dynamic spec: the first depths widest, up to `topk`, as long as
    the whole tree stays within `budget` nodes (depth 3, topk 2, budget 6 -> (2, 1, 1))."""
    widths = [1] * spec.depth

    def size(w: list[int]) -> int:
        total, level = 0, 1
        for x in w:
            level *= x
            total += level
        return total

    for d in range(spec.depth):
        while widths[d] < spec.topk and size(widths[:d] + [widths[d] + 1] + widths[d + 1:]) <= spec.budget:
            widths[d] += 1
        if widths[d] == 1:
            break
    return tuple(widths)


class SampledGrowth:
    """One sequence's stochastic tree while it grows: the same interface as `TreeGrowth` (frontier, partial,
    done, tree), fed per-node distributions instead of scored candidates."""

    def __init__(self, root: int, spec: TreeSpec, adaptive: bool = True) -> None:
        self.spec = spec
        self.tokens, self.parents, self.paths = [root], [-1], [()]
        self.scores = [1.0]  # path score: the product of q along the path (what `allocate` ranks by)
        self.rows: list[Tensor | None] = [None]
        self.frontier = [0]
        self.done = spec.depth == 0 or spec.budget == 0
        self.adaptive = spec.kind is TreeKind.DYNAMIC and adaptive  # else fixed widths (`sampled_widths`)
        if spec.kind is TreeKind.DYNAMIC:
            self._widths, self._choices = sampled_widths(spec), frozenset()
        else:
            self._widths, self._choices = (), frozenset(choices_of(spec))

    def width(self, node: int) -> int:
        """How many children `node` gets: fixed by the spec and the node's place, before any is drawn."""
        path = self.paths[node]
        if self._widths:
            return self._widths[len(path)] if len(path) < len(self._widths) else 0
        count = 0
        while path + (count,) in self._choices:
            count += 1
        return count

    def allocate(self, q_rows: Tensor) -> list[int]:
        """Children per frontier node for a dynamic spec, decided before any is drawn: this depth's share of
        the budget goes to the (node, rank) pairs of highest path score x rank-th largest q."""
        added = len(self.tokens) - 1
        depths_left = self.spec.depth - len(self.paths[self.frontier[0]])
        share = min(self.spec.topk, max(1, (self.spec.budget - added) // depths_left), self.spec.budget - added)
        if share <= 0:
            return [0] * len(self.frontier)
        top = q_rows.float().topk(min(share, q_rows.shape[-1]), dim=-1).values  # [frontier, share]
        scores = torch.tensor([self.scores[node] for node in self.frontier])[:, None]
        gains = (scores * top).flatten()
        chosen = gains.argsort(descending=True, stable=True)[:share]
        chosen = chosen[gains[chosen] > 0]
        return torch.bincount(chosen // top.shape[1], minlength=len(self.frontier)).tolist()

    def expand(self, q_rows: Tensor, generator: torch.Generator | None) -> None:
        """`q_rows [len(frontier), V]`: the drafter's distribution after each frontier node."""
        frontier = []
        widths = self.allocate(q_rows) if self.adaptive else [self.width(node) for node in self.frontier]
        for row, node in enumerate(self.frontier):
            q = q_rows[row].float()
            for rank in range(widths[row]):
                token = sample(q, generator)
                frontier.append(len(self.tokens))
                self.tokens.append(token)
                self.parents.append(node)
                self.paths.append(self.paths[node] + (rank,))
                self.scores.append(self.scores[node] * float(q_rows[row, token]))
                self.rows.append(q)
                q = q.clone()
                q[token] = 0.0
                mass = float(q.sum())
                if mass <= 1e-12:  # nothing left to draw from
                    break
                q = q / mass
        self.frontier = frontier
        depth = len(self.paths[frontier[0]]) if frontier else 0
        self.done = not frontier or depth >= self.spec.depth or (
            self.adaptive and len(self.tokens) - 1 >= self.spec.budget)

    def partial(self) -> TokenTree:
        return TokenTree.from_parents(self.tokens, self.parents)

    def tree(self) -> TokenTree:
        """The tree with each node's proposal row (row 0, the root's, is zeros)."""
        if len(self.tokens) == 1:
            return TokenTree.from_parents(self.tokens, self.parents)
        rows = [r for r in self.rows[1:]]
        probs = torch.stack([torch.zeros_like(rows[0])] + rows)
        return TokenTree.from_parents(self.tokens, self.parents, probs)


__all__ = ["Choice", "SampledGrowth", "sampled_widths"]
