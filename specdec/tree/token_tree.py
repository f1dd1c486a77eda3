"""Token trees: what a drafter proposes and the verifier checks, for one sequence.

Node 0 is the root: the sequence's last committed token, whose K/V is not in the cache yet. Every other node is
a drafted token whose parent comes before it. A chain of k drafted tokens is the tree with parents
`[-1, 0, 1, ..., k-1]`, so chains and trees share one code path. Every derived buffer (ancestor mask, positions,
root-to-leaf paths) comes from the parent array, as in the EAGLE and Medusa reference code.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

import torch
from torch import Tensor

from specdec.errors import ConfigError


@dataclass(frozen=True, eq=False)
class TokenTree:
    tokens: Tensor  # [N] int64; tokens[0] is the root
    parents: Tensor  # [N] int64; parents[0] == -1, parents[i] < i
    draft_probs: Tensor | None = None  # [N, V] float32: the distribution node i was drawn from (row 0 unused);
    #                                    None = every node is deterministic (one-hot proposal)
    source: Tensor | None = None  # [N] int64: which drafter(s) proposed node i (a drafter-defined id, e.g. a
    #                               hybrid's bitmask of parts; row 0 unused); None = one drafter made it all

    def __post_init__(self) -> None:
        validate_parents(self.parents.tolist())
        if self.tokens.shape != self.parents.shape:
            raise ConfigError("a tree needs exactly one parent per token")
        if self.draft_probs is not None and self.draft_probs.shape[0] != len(self):
            raise ConfigError("draft_probs needs one row per tree node")
        if self.source is not None and self.source.shape != self.tokens.shape:
            raise ConfigError("source needs one entry per tree node")

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @staticmethod
    def from_parents(tokens: list[int], parents: list[int], draft_probs: Tensor | None = None,
                     source: Tensor | None = None) -> "TokenTree":
        validate_parents(parents)
        return TokenTree(torch.tensor(tokens, dtype=torch.int64), torch.tensor(parents, dtype=torch.int64), draft_probs,
                         source)

    @staticmethod
    def chain(tokens: list[int], draft_probs: Tensor | None = None) -> "TokenTree":
        """The root followed by drafted tokens in a line."""
        return TokenTree.from_parents(tokens, list(range(-1, len(tokens) - 1)), draft_probs)

    @cached_property
    def parent_list(self) -> list[int]:
        return self.parents.tolist()

    @cached_property
    def token_list(self) -> list[int]:
        return self.tokens.tolist()

    @cached_property
    def depth(self) -> Tensor:  # [N] int64
        depth = [0] * len(self)
        for i, p in enumerate(self.parent_list[1:], start=1):
            depth[i] = depth[p] + 1
        return torch.tensor(depth, dtype=torch.int64)

    @cached_property
    def children(self) -> list[list[int]]:
        """Children of each node, in index order (the order the verifier tries them)."""
        kids: list[list[int]] = [[] for _ in range(len(self))]
        for i, p in enumerate(self.parent_list[1:], start=1):
            kids[p].append(i)
        return kids

    @cached_property
    def ancestor_mask(self) -> Tensor:  # [N, N] bool; [i, j] = j is i or an ancestor of i
        """Built from each node's ancestors as the bits of one Python int (a parent's, plus its own bit), unpacked
        in one numpy pass: a row OR per node in torch cost 23 us for a 7-node tree, every engine step."""
        n = len(self)
        bits = [1]
        for i, p in enumerate(self.parent_list[1:], start=1):
            bits.append(bits[p] | 1 << i)
        packed = np.frombuffer(b"".join(b.to_bytes((n + 7) // 8, "little") for b in bits), dtype=np.uint8)
        return torch.from_numpy(np.unpackbits(packed.reshape(n, -1), axis=1, count=n, bitorder="little").astype(bool))

    def positions(self, prefix_len: int) -> Tensor:
        """Absolute positions of the nodes when the cache already holds `prefix_len` tokens."""
        return self.depth + prefix_len

    @cached_property
    def paths(self) -> list[list[int]]:
        """Node indices from the root to each leaf."""
        leaves = [i for i, kids in enumerate(self.children) if not kids]
        out = []
        for leaf in leaves:
            path = [leaf]
            while self.parent_list[path[-1]] >= 0:
                path.append(self.parent_list[path[-1]])
            out.append(path[::-1])
        return out

    def cut(self, max_depth: int) -> "TokenTree":
        """The tree without nodes deeper than `max_depth` drafted tokens (the root is depth 0)."""
        depths = self.depth.tolist()
        if max(depths) <= max_depth:
            return self
        keep = [i for i, d in enumerate(depths) if d <= max_depth]
        index = {old: new for new, old in enumerate(keep)}
        parents = [-1] + [index[self.parent_list[i]] for i in keep[1:]]
        probs = self.draft_probs[keep] if self.draft_probs is not None else None
        source = self.source[keep] if self.source is not None else None
        return TokenTree.from_parents(self.tokens[keep].tolist(), parents, probs, source)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parent_list))


def validate_parents(parents: list[int]) -> None:
    """Reject malformed trees with a message saying what is wrong."""
    if not parents:
        raise ConfigError("a tree needs at least a root node")
    if parents[0] != -1:
        raise ConfigError(f"node 0 must be the root (parent -1), got parent {parents[0]}")
    for i, p in enumerate(parents[1:], start=1):
        if p == -1:
            raise ConfigError(f"node {i} is a second root; a tree has exactly one")
        if p == i:
            raise ConfigError(f"node {i} is its own parent (a cycle)")
        if p > i:
            raise ConfigError(f"node {i} comes before its parent {p}; parents must come first (or it is a cycle)")
        if p < -1:
            raise ConfigError(f"node {i} has an invalid parent {p}")
