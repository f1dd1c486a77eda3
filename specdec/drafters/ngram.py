"""`ngram[:n=3,k=8,branches=1,nodes=0]`: prompt lookup decoding, several matches as branches of one tree.

The last `m` tokens (m from n down to 1) are searched for in the prompt and the text generated so far; what
followed each earlier occurrence is a guess at what comes next. Summaries, retrieval answers and code edits
copy long spans of their input, so the guesses are often right and cost no model call at all. Different
matches that continue differently become sibling branches; shared prefixes merge into one trie.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from specdec.drafters.base import DrafterBase, DrafterContext
from specdec.drafters.registry import int_arg, node_planning_arg, register, reject_unknown
from specdec.engine.sequence import Sequence
from specdec.tree.growth import trie_tree
from specdec.tree.spec import TreeKind, TreeSpec, chain, dynamic
from specdec.tree.token_tree import TokenTree


class NgramDrafter(DrafterBase):
    name = "ngram"

    def __init__(self, n: int = 3, k: int = 8, branches: int = 1) -> None:
        self.n, self.k, self.branches = n, k, branches

    def default_tree(self) -> TreeSpec:
        if self.branches == 1:
            return chain(self.k)
        return dynamic(self.k, self.branches, self.k * self.branches)

    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        branches = 1 if spec.kind is TreeKind.CHAIN else max(spec.topk, 1)
        return [self._tree(seq.token_ids, spec.depth, branches, spec.budget) for seq in seqs]

    def _tree(self, tokens: list[int], depth: int, branches: int, budget: int) -> TokenTree:
        continuations = find_continuations(np.asarray(tokens, dtype=np.int64), self.n, depth, branches)
        return trie_tree(tokens[-1], continuations, budget)


def find_continuations(tokens: np.ndarray, n: int, length: int, branches: int) -> list[list[int]]:
    """Up to `branches` distinct continuations of the longest suffix match, most recent occurrence first."""
    found: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    total = len(tokens)
    if length <= 0:
        return found
    for m in range(min(n, total - 1), 0, -1):
        pattern = tokens[total - m:]
        windows = sliding_window_view(tokens[: total - 1], m)  # exclude the suffix matching itself
        starts = np.flatnonzero((windows == pattern).all(axis=1))
        for start in starts[::-1]:
            follow = tokens[start + m: start + m + length].tolist()
            key = tuple(follow)
            if follow and key not in seen:
                seen.add(key)
                found.append(follow)
                if len(found) >= branches:
                    return found
        if found:
            return found
    return found


@register("ngram")
def _build(args: dict[str, str], ctx: DrafterContext) -> NgramDrafter:
    drafter = NgramDrafter(
        n=int_arg(args, "n", 3), k=int_arg(args, "k", 8), branches=int_arg(args, "branches", 1)
    )
    drafter.plans_by_node = node_planning_arg(args)
    reject_unknown("ngram", args)
    return drafter
