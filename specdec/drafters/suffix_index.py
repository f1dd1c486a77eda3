"""Counted suffix tries for suffix decoding (Oliaro et al., 2025; ArcticInference).

A `SuffixTrie` indexes token sequences: the node for a string `w` (at most `max_depth` tokens) exists once `w`
has occurred, and its count is how many times it occurred, over every indexed sequence. That answers the two
questions suffix decoding asks each step, with no scan of the text:

* which suffixes of the current context occurred before (walk the trie with the context's last tokens), and
* what followed them, how often: the children of the matched node and their counts, recursively.

`speculate` turns a match into a draft tree by frequency-weighted best-first expansion: a child's estimated
probability is its parent's times `count(child) / sum(count of the parent's children)` (what followed the
pattern, among the occurrences that continued). The tree grows most-probable node first, drops nodes under
`min_prob`, and is at most `factor * match_len + offset` nodes: a long match is strong evidence, a one-token
match is weak. Every match length is tried and the draft with the highest score (the sum of its nodes'
probabilities, i.e. expected accepted tokens under this estimate) wins, as in ArcticInference.

Appending a token extends every live suffix by one node: `max_depth` dictionary steps, whatever the text length.
Removing a sequence (`remove`) walks its suffixes again and frees the nodes whose count drops to zero, which is
how `GlobalSuffixIndex` evicts old requests to stay within a node bound.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specdec.errors import ConfigError

ROOT = 0


@dataclass
class SuffixDraft:
    """A speculation tree below the context's last token. `parents[i]` indexes this draft; -1 is that root."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)  # estimated P(node accepted), non-increasing down a path
    support: list[int] = field(default_factory=list)  # occurrences behind each node's estimate: how often its
    #                                                   parent's pattern was followed by anything at all
    match_len: int = 0

    @property
    def score(self) -> float:
        return sum(self.probs)


Push = Callable[[list, itertools.count, Any, float, int, int], None]


def best_first(push: Push, root: Any, max_tokens: int, max_depth: int) -> SuffixDraft:
    """Grow a draft most probable node first. `push(heap, order, key, prob, parent, depth)` pushes the children
    of the node `key` (probability `prob`, draft index `parent`) as `(-prob, next(order), child key, token,
    parent, depth, support)`; the trie's keys are its nodes, the corpus array's the positions of occurrences."""
    draft = SuffixDraft()
    heap: list[tuple[float, int, Any, int, int, int, int]] = []
    order = itertools.count()
    push(heap, order, root, 1.0, -1, 1)
    while heap and len(draft.tokens) < max_tokens:
        neg, _, key, token, parent, depth, support = heapq.heappop(heap)
        index = len(draft.tokens)
        draft.tokens.append(token)
        draft.parents.append(parent)
        draft.probs.append(-neg)
        draft.support.append(support)
        if depth < max_depth:
            push(heap, order, key, -neg, index, depth + 1)
    return draft


def best_over_matches(found: list[tuple[int, int, Any]], expand: Callable[[Any, int, int], SuffixDraft],
                      max_tokens: int, depth_for: Callable[[int], int], factor: float, offset: float) -> SuffixDraft:
    """The best-scoring draft over every match: `found` lists `(m, occurrences, handle)` for the matched suffix
    lengths m, increasing; `expand(handle, node limit, depth)` drafts from one match, at most `depth_for(m)`
    deep and `factor * m + offset` nodes (within `max_tokens`).

    Longest match first: a draft scores at most its node limit (each probability is at most 1), so once the best
    score reaches a shorter match's limit, that match cannot win and is not expanded. Ties go to the longer
    match. A match whose next-longer one has as many occurrences is skipped: every occurrence extends one token
    further, so the longer one has the same continuations and a larger limit."""
    best = SuffixDraft()
    for i in range(len(found) - 1, -1, -1):
        m, occurrences, handle = found[i]
        if i + 1 < len(found) and found[i + 1][1] == occurrences:
            continue
        limit = min(max_tokens, int(m * factor + offset + 1e-9))
        depth = depth_for(m)
        if limit <= 0 or depth <= 0 or (best.tokens and limit <= best.score):
            continue
        draft = expand(handle, limit, depth)
        if draft.tokens and (not best.tokens or draft.score > best.score):
            draft.match_len = m
            best = draft
    return best


class SuffixTrie:
    def __init__(self, max_depth: int = 24) -> None:
        if max_depth < 2:
            raise ConfigError(f"a suffix trie needs max_depth >= 2, got {max_depth}")
        self.max_depth = max_depth
        self._children: list[dict[int, int] | None] = [None]  # per node: token -> child node
        self._count: list[int] = [0]  # per node: occurrences of its string (root: indexed positions)
        self._free: list[int] = []  # node ids to reuse
        self._seqs: dict[int, list[int]] = {}  # sequence id -> its tokens (removal walks them again)
        self._active: dict[int, list[int]] = {}  # sequence id -> nodes of its live suffixes, longest first

    # ----------------------------------------------------------------------------------------------- size
    @property
    def num_nodes(self) -> int:
        """Nodes in use, the root not counted: the unit of the memory bound."""
        return len(self._count) - 1 - len(self._free)

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def length(self, seq_id: int) -> int:
        return len(self._seqs.get(seq_id, ()))

    # ------------------------------------------------------------------------------------------- updates
    def extend(self, seq_id: int, tokens: list[int]) -> None:
        """Append `tokens` to sequence `seq_id` (a new id starts a new sequence)."""
        seq = self._seqs.setdefault(seq_id, [])
        active = self._active.setdefault(seq_id, [])
        children, count, limit = self._children, self._count, self.max_depth - 1
        for token in tokens:
            active.append(ROOT)
            for i, node in enumerate(active):
                kids = children[node]
                if kids is None:
                    kids = children[node] = {}
                child = kids.get(token)
                if child is None:
                    child = kids[token] = self._new_node()
                count[child] += 1
                active[i] = child
            if len(active) > limit:  # the longest suffix reached max_depth: it cannot grow further
                del active[0]
            seq.append(token)
        count[ROOT] += len(tokens)

    def close(self, seq_id: int) -> None:
        """The sequence will not grow again: drop its live-suffix list (its counts stay)."""
        self._active.pop(seq_id, None)

    def remove(self, seq_id: int) -> None:
        """Take a sequence's occurrences out of the counts and free every node left with none."""
        seq = self._seqs.pop(seq_id, None)
        self._active.pop(seq_id, None)
        if seq is None:
            return
        children, count = self._children, self._count
        for start in range(len(seq)):
            node = ROOT
            for token in seq[start: start + self.max_depth]:
                kids = children[node]
                child = kids[token]  # type: ignore[index]
                count[child] -= 1
                if count[child] == 0:
                    del kids[token]  # type: ignore[union-attr]
                    self._free_chain(child)
                    break
                node = child
        count[ROOT] -= len(seq)

    # ------------------------------------------------------------------------------------------- queries
    def count(self, pattern: list[int]) -> int:
        """Occurrences of `pattern` in the indexed sequences (0 if absent or longer than max_depth)."""
        node = self._walk(pattern)
        return 0 if node is None else self._count[node]

    def matches(self, context: list[int], seq_id: int | None = None) -> list[tuple[int, int]]:
        """(m, node) for every m such that the last m tokens of `context` occur in the trie, m increasing.

        When `context` is exactly the indexed sequence `seq_id`, its live-suffix list already holds these
        nodes; otherwise each suffix is walked from the root.
        """
        if seq_id is not None and self.length(seq_id) == len(context) and seq_id in self._active:
            active = self._active[seq_id]
            return [(len(active) - i, node) for i, node in reversed(list(enumerate(active)))]
        out: list[tuple[int, int]] = []
        for m in range(1, min(len(context), self.max_depth - 1) + 1):
            node = self._walk(context[len(context) - m:])
            if node is None:
                break
            out.append((m, node))
        return out

    def speculate(self, context: list[int], max_tokens: int, max_depth: int, factor: float = 1.0,
                  offset: float = 0.0, min_prob: float = 0.1, branching: int = 0,
                  seq_id: int | None = None) -> SuffixDraft:
        """The best-scoring draft over all match lengths (see the module docstring); empty if nothing matches.

        `branching` caps children per node (1 = a single path, 0 = no cap); `max_depth` caps the draft depth.
        """
        found = [(m, self._count[node], node) for m, node in self.matches(context, seq_id)]
        return best_over_matches(
            found, lambda node, limit, depth: self.expand(node, limit, depth, min_prob, branching),
            max_tokens, lambda m: min(max_depth, self.max_depth - m), factor, offset)

    def expand(self, node: int, max_tokens: int, max_depth: int, min_prob: float, branching: int = 0) -> SuffixDraft:
        """Best-first frequency-weighted expansion below `node`."""
        def push(heap: list, order: itertools.count, trie_node: int, prob: float, parent: int, depth: int) -> None:
            self._push_children(heap, order, trie_node, prob, parent, depth, min_prob, branching)
        return best_first(push, node, max_tokens, max_depth)

    # ------------------------------------------------------------------------------------------ internals
    def _push_children(self, heap: list, order: itertools.count, node: int, prob: float, parent: int, depth: int,
                       min_prob: float, branching: int) -> None:
        kids = self._children[node]
        if not kids:
            return
        total, ranked = self._rank(kids, min_prob, prob)
        if branching > 0:
            ranked = ranked[:branching]
        for n, token, child in ranked:
            heapq.heappush(heap, (-prob * n / total, next(order), child, token, parent, depth, total))

    def _rank(self, kids: dict[int, int], min_prob: float = 0.0,
              prob: float = 1.0) -> tuple[int, list[tuple[int, int, int]]]:
        """The children's total count, and (count, token, child) for those whose share keeps the path above
        `min_prob`, most frequent first."""
        count = self._count
        total = sum(count[c] for c in kids.values())
        need = min_prob * total / prob  # the least count that keeps a child above min_prob
        return total, sorted(((count[c], t, c) for t, c in kids.items() if count[c] >= need), reverse=True)

    def _walk(self, pattern: list[int]) -> int | None:
        if len(pattern) > self.max_depth:
            return None
        node, children = ROOT, self._children
        for token in pattern:
            kids = children[node]
            if not kids or token not in kids:
                return None
            node = kids[token]
        return node

    def _new_node(self) -> int:
        if self._free:
            node = self._free.pop()
            self._children[node] = None
            self._count[node] = 0
            return node
        self._children.append(None)
        self._count.append(0)
        return len(self._count) - 1

    def _free_chain(self, node: int) -> None:
        """Free `node` and the nodes below it, which (having at most its zero count) held only this occurrence."""
        stack = [node]
        while stack:
            n = stack.pop()
            kids = self._children[n]
            if kids:
                stack.extend(kids.values())
            self._children[n] = None
            self._count[n] = 0
            self._free.append(n)


class GlobalSuffixIndex:
    """Finished requests' outputs in one trie, evicted oldest first to stay within `max_nodes`."""

    def __init__(self, max_depth: int = 24, max_nodes: int = 200_000) -> None:
        if max_nodes < max_depth:
            raise ConfigError(f"the global suffix index needs max_nodes >= max_depth, got {max_nodes}")
        self.trie = SuffixTrie(max_depth)
        self.max_nodes = max_nodes
        self._order: deque[int] = deque()
        self._next_id = 0

    def add(self, tokens: list[int]) -> None:
        """Index one output; a sequence adds at most `len * max_depth` nodes, so it is cut to fit the bound."""
        tokens = tokens[: self.max_nodes // self.trie.max_depth]
        if not tokens:
            return
        seq_id, self._next_id = self._next_id, self._next_id + 1
        self.trie.extend(seq_id, tokens)
        self.trie.close(seq_id)
        self._order.append(seq_id)
        while self.trie.num_nodes > self.max_nodes and len(self._order) > 1:
            self.trie.remove(self._order.popleft())

    def reset(self) -> None:
        self.__init__(self.trie.max_depth, self.max_nodes)  # type: ignore[misc]

    @property
    def num_requests(self) -> int:
        return len(self._order)
