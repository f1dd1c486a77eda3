"""A read-only suffix array over a corpus, for `suffix:corpus=...`: two int32 arrays where a trie needed gigabytes.

The corpus drafter asks what `SuffixTrie` answers (which suffixes of the context occurred, and what followed
them, how often), over a million tokens that never change. A Python trie holds that in about 250 bytes a node:
6.9M nodes and 1.5 GB for the 1.1M-token default corpus indexed 12 deep. Here the corpus is one int32 array
(answers separated by `SEP`) and the index is a second one, every token position sorted by the tokens *before*
it, read backwards (the position's own token first, then the one before, up to `match_depth`): 9 MB.

Sorting by the reversed text makes matching one narrowing search: the positions where the context's last token
occurs are one range, those where its last two occur are a sub-range of it, and so on, so every match length
comes out of one pass of `match_depth` binary searches. The positions in a range are where earlier text ended
as the context does; what followed them is read forward from the corpus array, counted with `np.unique`, and
expanded best first exactly as the trie expands (same probabilities, same tie order, same score), except that
a draft may run deeper than the match: a 10-token match continues as far as the tree spec allows, where a trie
12 deep could only add 2 more.

A short match on a frequent token has tens of thousands of occurrences; counting them all at every step would
cost more than the draft saves, so a range larger than `sample` is read at `sample` evenly spaced positions (its
counts become an estimate; longer, rarer matches are counted exactly).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Iterable

import numpy as np

from specdec.drafters.suffix_index import SuffixDraft, best_first, best_over_matches
from specdec.errors import ConfigError

SEP = -1  # between answers (and before the first): no match or continuation crosses it
DEFAULT_SAMPLE = 1024
GATHER_MAX = 256  # a range up to this size is searched by one gather and np.searchsorted, larger ones by bisection
SMALL_COUNT = 32  # continuations up to this many are counted in Python (same order as np.unique + lexsort)


class CorpusSuffixArray:
    def __init__(self, tokens: np.ndarray, order: np.ndarray, match_depth: int, sample: int = DEFAULT_SAMPLE) -> None:
        self.tokens = tokens  # int32, SEP-separated answers, SEP first and last
        self.order = order  # int32 positions of tokens, sorted by (tokens[p], tokens[p-1], ...) up to match_depth
        self.match_depth = match_depth
        self.sample = sample
        # the positions whose last token is v are order[starts[v]:starts[v + 1]] (the first search is a lookup)
        self._tokens_mv, self._order_mv = memoryview(tokens), memoryview(order)  # Python ints, no copy
        self._indices = range(order.size)
        last = tokens[order]
        self._starts = np.searchsorted(last, np.arange(int(last[-1]) + 2 if len(last) else 1))

    @classmethod
    def build(cls, sequences: Iterable[list[int]], match_depth: int = 12,
              sample: int = DEFAULT_SAMPLE) -> CorpusSuffixArray:
        if match_depth < 1 or sample < 1:
            raise ConfigError(f"a corpus suffix array needs match_depth >= 1 and sample >= 1, got {match_depth}, "
                              f"{sample}")
        parts: list[int] = [SEP]
        for seq in sequences:
            if seq:
                parts.extend(seq)
                parts.append(SEP)
        tokens = np.asarray(parts, dtype=np.int64)
        if tokens.size and int(tokens.max(initial=0)) >= 2 ** 31 - 1:
            raise ConfigError("corpus token ids must fit in int32")
        positions = np.flatnonzero(tokens != SEP)
        # keys[j] is the token j places before each position, SEP once that crosses the answer's start (the
        # separator itself is SEP, and everything before it must read as SEP too, or sorting would look into
        # the previous answer)
        sep_at = np.flatnonzero(tokens == SEP)
        start = sep_at[np.searchsorted(sep_at, positions) - 1] + 1  # first position of each position's answer
        keys = []
        for j in range(match_depth):
            back = positions - j
            keys.append(np.where(back >= start, tokens[np.maximum(back, 0)], SEP))
        order = positions[np.lexsort(keys[::-1])] if positions.size else positions  # keys[0] is the primary key
        return cls(tokens.astype(np.int32), order.astype(np.int32), match_depth, sample)

    # ------------------------------------------------------------------------------------------- size
    @property
    def num_tokens(self) -> int:
        return int(self.order.size)

    @property
    def nbytes(self) -> int:
        return int(self.tokens.nbytes + self.order.nbytes + self._starts.nbytes)

    # ------------------------------------------------------------------------------------------- queries
    def matches(self, context: list[int]) -> list[tuple[int, int, int]]:
        """(m, lo, hi) for every m such that the last m tokens of `context` occur, m increasing: they end at
        positions `order[lo:hi]`."""
        out: list[tuple[int, int, int]] = []
        if not context:
            return out
        last = context[-1]
        if not 0 <= last < len(self._starts) - 1:
            return out
        lo, hi = int(self._starts[last]), int(self._starts[last + 1])
        longest = min(len(context), self.match_depth)
        for j in range(1, longest + 1):
            if lo >= hi:
                break
            out.append((j, lo, hi))
            if j == longest:
                break
            # every position in [lo, hi) matched j tokens, so the token j back is the key that orders the range
            # (the separator itself where the answer began j tokens back)
            token = context[-1 - j]
            if hi - lo > GATHER_MAX:  # bisect by scalar reads: a frequent token's range is tens of thousands
                def key(i: int, j: int = j) -> int:
                    return self._tokens_mv[self._order_mv[i] - j]
                lo = bisect.bisect_left(self._indices, token, lo, hi, key=key)
                hi = bisect.bisect_right(self._indices, token, lo, hi, key=key)
            else:
                column = self.tokens[self.order[lo:hi] - j]
                lo, hi = (lo + int(np.searchsorted(column, token, "left")),
                          lo + int(np.searchsorted(column, token, "right")))
        return out

    def count(self, pattern: list[int]) -> int:
        """Occurrences of `pattern` (up to match_depth tokens) in the corpus."""
        found = self.matches(pattern)
        return found[-1][2] - found[-1][1] if found and found[-1][0] == len(pattern) else 0

    def speculate(self, context: list[int], max_tokens: int, max_depth: int, factor: float = 1.0,
                  offset: float = 0.0, min_prob: float = 0.1, branching: int = 0) -> SuffixDraft:
        """The best-scoring draft over all match lengths, as `SuffixTrie.speculate` (see its module), except
        that a draft may run `max_depth` deep however long its match."""
        found = [(m, hi - lo, (lo, hi)) for m, lo, hi in self.matches(context)]
        return best_over_matches(
            found, lambda span, limit, depth: self.expand(self._ends(*span), limit, depth, min_prob, branching),
            max_tokens, lambda m: max_depth, factor, offset)

    def expand(self, ends: np.ndarray, max_tokens: int, max_depth: int, min_prob: float,
               branching: int = 0) -> SuffixDraft:
        """Best-first frequency-weighted expansion of what followed the positions `ends`."""
        def push(heap: list, order: itertools.count, at: np.ndarray, prob: float, parent: int, depth: int) -> None:
            self._push_children(heap, order, at, prob, parent, depth, min_prob, branching)
        return best_first(push, ends, max_tokens, max_depth)

    # ------------------------------------------------------------------------------------------ internals
    def _ends(self, lo: int, hi: int) -> np.ndarray:
        if hi - lo <= self.sample:
            return self.order[lo:hi]
        return self.order[lo + (np.arange(self.sample, dtype=np.int64) * (hi - lo)) // self.sample]

    def _push_children(self, heap: list, order: itertools.count, ends: np.ndarray, prob: float, parent: int,
                       depth: int, min_prob: float, branching: int) -> None:
        after = self.tokens[ends + 1]
        continued = after != SEP
        after, ends = after[continued], ends[continued] + 1
        total = int(after.size)
        if not total:
            return
        if total <= SMALL_COUNT:  # a long match's few occurrences: counted in Python, numpy's calls cost more
            counted: dict[int, int] = {}
            for token in after.tolist():
                counted[token] = counted.get(token, 0) + 1
            ranked = sorted(counted.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        else:
            values, counts = np.unique(after, return_counts=True)
            by_count = np.lexsort((values, counts))[::-1]  # most frequent first, the larger token among equals
            ranked = list(zip(values[by_count].tolist(), counts[by_count].tolist()))
        need = min_prob * total / prob
        for token, n in ranked[:branching] if branching > 0 else ranked:  # (as the trie orders them)
            if n < need:
                break
            heapq.heappush(heap, (-prob * n / total, next(order), ends[after == token], token, parent, depth, total))
