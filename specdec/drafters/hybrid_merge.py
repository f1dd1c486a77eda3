"""One tree from several drafters' proposals: merge into a trie, keep the nodes most likely to be accepted.

Each drafter proposes a *scored tree* below the same root (the sequence's last token): per node, a raw score,
its own guess at P(node accepted | parent accepted). Merging is a trie union: the same token path proposed by
two drafters is one node (a shared prefix costs one verified row, not two), remembered with the set of drafters
that proposed it. Each node's conditional acceptance comes from the online calibration (per proposer set,
depth and raw-score bin), its path probability is the product down from the root, and the tree keeps the
`budget` nodes of highest path probability. A child never scores above its parent, so growing best-first from
the root yields exactly those nodes, parents before children. After verification `observe` tells the
calibration which of the nodes the verifier tried were accepted.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from specdec.drafters.calibration import AcceptanceCalibration
from specdec.errors import ConfigError


@dataclass(frozen=True)
class ScoredTree:
    """One drafter's proposal: node 0 is the root; `scores[i]` is the raw P(accept i | parent accepted)."""

    tokens: list[int]  # [N], tokens[0] = root
    parents: list[int]  # [N], parents[0] = -1, parents[i] < i
    scores: list[float]  # [N], scores[0] unused

    def __post_init__(self) -> None:
        if not (len(self.tokens) == len(self.parents) == len(self.scores)) or not self.tokens:
            raise ConfigError("a scored tree needs a root and one parent and score per node")


@dataclass(frozen=True)
class MergedTree:
    """The selected tree, parents before children, with what calibration and metrics need per node."""

    tokens: list[int]  # [N], tokens[0] = root
    parents: list[int]  # [N]
    depths: list[int]  # [N], depths[0] = 0
    sources: list[int]  # [N] bitmask of the drafters that proposed the node (bit i = drafter i); root 0
    raw: list[float]  # [N] the best raw score among the node's proposers (the calibration bin)
    probs: list[float]  # [N] estimated P(node on the accepted path); probs[0] = 1


def merge_trees(proposals: list[ScoredTree], calibration: AcceptanceCalibration, budget: int,
                max_depth: int, min_prob: float = 0.0) -> MergedTree:
    """Trie union of `proposals` (drafter i = bit i), cut to the `budget` most probable nodes; nodes whose
    estimated path probability is below `min_prob` are not worth their verification row and are left out."""
    root = proposals[0].tokens[0] if proposals else 0
    if any(p.tokens[0] != root for p in proposals):
        raise ConfigError("every merged proposal must grow from the same root token")
    # Union trie: node -> {token: node}; per node, the proposers and each one's raw score.
    kids: list[dict[int, int]] = [{}]
    token_of, depth_of = [root], [0]
    raws: list[dict[int, float]] = [{}]
    for i, tree in enumerate(proposals):
        bit = 1 << i
        where = [0] * len(tree.tokens)
        for n in range(1, len(tree.tokens)):
            up = where[tree.parents[n]]
            token = tree.tokens[n]
            node = kids[up].get(token)
            if node is None:
                node = kids[up][token] = len(token_of)
                kids.append({})
                token_of.append(token)
                depth_of.append(depth_of[up] + 1)
                raws.append({})
            raws[node][bit] = max(raws[node].get(bit, 0.0), float(tree.scores[n]))
            where[n] = node

    def conditional(node: int) -> tuple[int, float, float]:
        mask = sum(raws[node])
        best_raw = max(raws[node].values())
        depth = depth_of[node]
        if len(raws[node]) == 1:
            return mask, best_raw, calibration.estimate(mask, depth, best_raw)
        # Agreement is its own kind; before it has evidence, it is as good as its best proposer.
        prior = max(calibration.estimate(bit, depth, raw) for bit, raw in raws[node].items())
        return mask, best_raw, calibration.estimate(mask, depth, best_raw, prior=prior)

    out = MergedTree([root], [-1], [0], [0], [0.0], [1.0])
    heap: list[tuple[float, int, int, int, float]] = []  # (-path prob, trie node, out parent, mask, raw)

    def push_children(trie_node: int, out_index: int, prob: float) -> None:
        if depth_of[trie_node] >= max_depth:
            return
        for child in kids[trie_node].values():
            mask, raw, p = conditional(child)
            if prob * p >= min_prob and p > 0.0:
                heapq.heappush(heap, (-prob * p, child, out_index, mask, raw))

    push_children(0, 0, 1.0)
    while heap and len(out.tokens) - 1 < budget:
        neg, node, parent, mask, raw = heapq.heappop(heap)
        index = len(out.tokens)
        out.tokens.append(token_of[node])
        out.parents.append(parent)
        out.depths.append(depth_of[node])
        out.sources.append(mask)
        out.raw.append(raw)
        out.probs.append(-neg)
        push_children(node, index, -neg)
    return out


def observe_verification(merged: MergedTree, accepted_nodes: list[int], calibration: AcceptanceCalibration,
                         verified: list[int] | None = None) -> None:
    """Count every node the verifier tried (its parent was accepted) and whether it was accepted itself.

    `verified` lists the merged nodes that were verified, when the engine cut the tree (default: all)."""
    on_path = set(accepted_nodes)
    for node in (range(1, len(merged.tokens)) if verified is None else verified):
        if node and merged.parents[node] in on_path:
            calibration.observe(merged.sources[node], merged.depths[node], merged.raw[node], node in on_path)
