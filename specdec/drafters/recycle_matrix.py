"""The Token Recycling adjacency matrix (Luo et al., 2024): for every token, the k tokens the target ranked
highest the last time it ran after that token.

Why it works. Every verify pass computes the target's logits at every tree node, accepted or not, and plain
decoding throws all but one row away. Those rows are good guesses at what follows each node's token next time
it appears (language repeats its bigrams), so we *recycle* them: after a step, row `t` of a `[V, k]` int32
matrix gets the top-k of the logits computed at a node whose token is `t`. Drafting is then free: a static
tree template of ranks is expanded from the root by lookups, level by level, with no model call.

Rows never written hold -1; template nodes that land on -1 (and their subtrees) are dropped, so a cold matrix
drafts nothing rather than garbage. The matrix lives as long as the engine (that is the method: what one
request taught helps the next), costs exactly `V * k * 4` bytes, and `reset()` forgets everything.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from specdec import kernels
from specdec.errors import ConfigError
from specdec.kernels import cpu as cpu_kernels

Choice = tuple[int, ...]
UNSEEN = -1


@dataclass(frozen=True)
class TemplateLayout:
    """A static template of rank paths as level-by-level index arrays (node 0 is the root).

    Node n (n >= 1) is rank `ranks[n]` of its parent's row; `levels[d]` lists the nodes at depth d + 1, so a
    whole level is expanded by one gather.
    """

    parents: np.ndarray  # [N] int64, parents[0] == -1, parents before children
    ranks: np.ndarray  # [N] int64, ranks[0] unused (0)
    levels: tuple[np.ndarray, ...]  # levels[d]: [n_d] int64 node indices at depth d + 1

    @property
    def num_nodes(self) -> int:
        return int(self.parents.shape[0])


@lru_cache(maxsize=64)
def template_layout(choices: tuple[Choice, ...]) -> TemplateLayout:
    """Lay out Medusa-style choice paths; every path's parent path must be in the template."""
    ordered = sorted(set(choices), key=lambda c: (len(c), c))
    index: dict[Choice, int] = {(): 0}
    parents, ranks, depths = [-1], [0], [0]
    for path in ordered:
        if not path or path[:-1] not in index:
            raise ConfigError(f"template path {path} has no parent {path[:-1]} in the template")
        index[path] = len(parents)
        parents.append(index[path[:-1]])
        ranks.append(path[-1])
        depths.append(len(path))
    depth_arr = np.asarray(depths, dtype=np.int64)
    levels = tuple(np.flatnonzero(depth_arr == d) for d in range(1, int(depth_arr.max()) + 1))
    return TemplateLayout(np.asarray(parents, dtype=np.int64), np.asarray(ranks, dtype=np.int64), levels)


class AdjacencyMatrix:
    """`[V, k]` int32 successor table, updated from verified logits and expanded along static templates.

    Beside each successor it keeps the probability the target gave it when the row was written (`probs`,
    `[V, k]` float32): a confidence signal that lets `expand_best_first` spend a node budget where the target
    was sure, instead of on a fixed shape.

    With `pair_bits > 0` a second table keyed by the *two* last tokens (previous, current) sits in front of
    the first: `2 ** pair_bits` hashed rows (key, k successors, k probabilities), written beside the single
    rows and read first; a pair never seen, or overwritten by another pair hashed to its slot, falls back to
    the single-token row. "of the" predicts its successor far better than "the" alone.
    """

    def __init__(self, vocab_size: int, k: int = 8, pair_bits: int = 0) -> None:
        if vocab_size < 2 or k < 1 or not 0 <= pair_bits <= 24:
            raise ConfigError(f"an adjacency matrix needs vocab_size >= 2, k >= 1 and 0 <= pair_bits <= 24, got "
                              f"{vocab_size}, {k}, {pair_bits}")
        self.k = min(k, vocab_size)
        self.table = np.full((vocab_size, self.k), UNSEEN, dtype=np.int32)  # [V, k]
        self.probs = np.zeros((vocab_size, self.k), dtype=np.float32)  # [V, k] target probability when written
        self.pair_bits = pair_bits
        slots = 1 << pair_bits if pair_bits else 0
        self.pair_keys = np.full(slots, -1, dtype=np.int64)  # [H] prev * V + token, -1 = empty
        self.pair_table = np.full((slots, self.k), UNSEEN, dtype=np.int32)  # [H, k]
        self.pair_probs = np.zeros((slots, self.k), dtype=np.float32)  # [H, k]
        # The same memory as torch tensors, for the compiled writes and expansions (recycle_matrix.cpp); every
        # method writes the arrays in place, so the views stay true. None: compiled where the kernels are built.
        self._views = tuple(torch.from_numpy(a) for a in (self.table, self.probs, self.pair_keys, self.pair_table,
                                                          self.pair_probs))
        self.compiled: bool | None = None

    def uses_kernels(self) -> bool:
        """Whether writes and template expansions run compiled (decided once, where the kernels are built)."""
        if self.compiled is None:
            self.compiled = cpu_kernels.available()
        return self.compiled

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[0])

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.table, self.probs, self.pair_keys, self.pair_table, self.pair_probs)))

    def reset(self) -> None:
        for array, empty in ((self.table, UNSEEN), (self.probs, 0.0), (self.pair_keys, -1),
                             (self.pair_table, UNSEEN), (self.pair_probs, 0.0)):
            array.fill(empty)

    # ----------------------------------------------------------------------------------------------- writes
    def update(self, tokens: Tensor, logits: Tensor, prev: Tensor | None = None) -> None:
        """Write row `tokens[i]` := top-k of `logits[i]` for every i. `tokens [N] int`, `logits [N, V]`;
        `prev [N]`: the token before each one (-1 = none), for the pair rows.

        When a token (or pair) occurs at several nodes, the last one in the given order wins (callers pass the
        accepted path last: its context is the one that really happened).
        """
        n = int(tokens.shape[0])
        if n == 0:
            return
        if logits.shape[0] != n or logits.shape[-1] != self.vocab_size:
            raise ConfigError(f"update needs logits [{n}, {self.vocab_size}], got {list(logits.shape)}")
        probs, succ = self.top(logits)
        before = [-1] * n if prev is None else prev.tolist()
        self.write_rows(tokens.tolist(), before, list(range(n)), succ, probs)

    def top(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """Each row's k best successors' probabilities `[N, k]` float32 and ids `[N, k]` int64, best first."""
        if logits.shape[-1] != self.vocab_size:
            raise ConfigError(f"logits must have {self.vocab_size} columns, got {list(logits.shape)}")
        top_probs, top_ids = kernels.top_k_probs(logits.float(), self.k)
        return top_probs.cpu(), top_ids.cpu()

    def write_rows(self, tokens: list[int], prev: list[int], rows: list[int], top_ids: Tensor,
                   top_probs: Tensor) -> None:
        """Row `tokens[i]` := row `rows[i]` of `top` (`top_ids`, `top_probs`), in order; `prev[i]` is the token
        before it (-1 = none). What a verified step writes: one compiled call where the kernels are built."""
        if self.uses_kernels():
            as_ids = [torch.from_numpy(np.array(values, dtype=np.int64)) for values in (tokens, prev, rows)]
            cpu_kernels.recycle_write(self._views, self.pair_bits, *as_ids, top_ids.contiguous(),
                                      top_probs.contiguous())
            return
        index = np.array(rows, dtype=np.int64)
        self.write(np.array(tokens, dtype=np.int64), top_ids.numpy()[index].astype(np.int32),
                   top_probs.numpy()[index], np.array(prev, dtype=np.int64))

    def write(self, tokens: np.ndarray, succ: np.ndarray, probs: np.ndarray, prev: np.ndarray | None = None) -> None:
        """`update` from top-k already taken (`top`): rows `tokens [N]` := `succ [N, k]` with `probs [N, k]`."""
        ids = tokens.astype(np.int64, copy=False)
        last = _last_occurrences(ids)
        self.table[ids[last]] = succ[last]
        self.probs[ids[last]] = probs[last]
        if self.pair_bits and prev is not None:
            before = prev.astype(np.int64, copy=False)
            has = np.flatnonzero(before >= 0)
            self._write_pairs(before[has] * self.vocab_size + ids[has], succ[has], probs[has])

    def _write_pairs(self, keys: np.ndarray, succ: np.ndarray, probs: np.ndarray) -> None:
        """Pair rows `keys [N]` (prev * V + token) := `succ`, `probs` (`[N, <= k]`) in their hashed slots; two
        keys on one slot: the later wins."""
        slots = self._slots(keys)
        last = _last_occurrences(slots)
        width = succ.shape[1]
        self.pair_keys[slots[last]] = keys[last]
        self.pair_table[slots[last], :width] = succ[last]
        self.pair_probs[slots[last], :width] = probs[last]

    def seen(self) -> dict[str, np.ndarray]:
        """The rows ever written, as arrays (what `recycle_store.save_matrix` keeps): single rows by token id,
        pair rows by their (previous, token) key."""
        rows = np.flatnonzero(self.table[:, 0] != UNSEEN)
        pairs = np.flatnonzero(self.pair_keys >= 0)
        return {"rows": rows, "succ": self.table[rows], "probs": self.probs[rows], "pair_keys": self.pair_keys[pairs],
                "pair_succ": self.pair_table[pairs], "pair_probs": self.pair_probs[pairs]}

    def restore(self, rows: np.ndarray, succ: np.ndarray, probs: np.ndarray, pair_keys: np.ndarray,
                pair_succ: np.ndarray, pair_probs: np.ndarray) -> None:
        """Write rows kept by `seen` back, with at most this matrix's k successors each (fewer leave the rest
        unseen). Pair rows go to this matrix's own slots, so a matrix of any `pair_bits` reads any saved one;
        two keys on one slot: the later wins, as in `write`."""
        k = min(self.k, succ.shape[1])
        self.table[rows, :k] = succ[:, :k]
        self.probs[rows, :k] = probs[:, :k]
        if self.pair_bits and pair_keys.shape[0]:
            self._write_pairs(pair_keys.astype(np.int64), pair_succ[:, :k], pair_probs[:, :k])

    # ------------------------------------------------------------------------------------------------ reads
    def rows(self, prev: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Successors `[n, k]` and their probabilities after each (prev, token): the pair row where one is
        stored, else the token's own row."""
        succ, probs = self.table[tokens], self.probs[tokens]
        if self.pair_bits:
            keys = np.where(prev >= 0, prev * self.vocab_size + tokens, -2)
            slots = self._slots(keys)
            hit = self.pair_keys[slots] == keys
            succ = np.where(hit[:, None], self.pair_table[slots], succ)
            probs = np.where(hit[:, None], self.pair_probs[slots], probs)
        return succ, probs

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        """Fibonacci hashing of int64 keys onto `2 ** pair_bits` slots."""
        mixed = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        return (mixed >> np.uint64(64 - self.pair_bits)).astype(np.int64)

    def expand(self, root: int, layout: TemplateLayout, max_depth: int | None = None,
               prev: int = -1) -> tuple[list[int], list[int]]:
        """Tokens and parents of the template filled from `root` (root first), unseen rows pruned; `prev` is
        the token before the root (for pair rows).

        Template siblings take distinct ranks of one row, and a row's k entries are distinct, so the result
        never holds two siblings with the same token.
        """
        tokens = np.full(layout.num_nodes, UNSEEN, dtype=np.int64)
        before = np.full(layout.num_nodes, -1, dtype=np.int64)  # the token before each node
        tokens[0], before[0] = root, prev
        parents, ranks = layout.parents, layout.ranks
        levels = layout.levels if max_depth is None else layout.levels[:max_depth]
        for level in levels:
            up = parents[level]
            ok = (tokens[up] >= 0) & (ranks[level] < self.k)
            got = np.full(level.shape[0], UNSEEN, dtype=np.int64)
            if ok.any():
                succ, _ = self.rows(before[up[ok]], tokens[up[ok]])
                got[ok] = succ[np.arange(succ.shape[0]), ranks[level][ok]]
            tokens[level] = got
            before[level] = tokens[up]
        count = 1 + sum(int(level.shape[0]) for level in levels)
        keep = np.flatnonzero(tokens[:count] >= 0)  # a pruned parent (-1) makes its children -1 too
        new_index = np.full(count, -1, dtype=np.int64)
        new_index[keep] = np.arange(keep.shape[0])
        new_parents = np.where(parents[keep] >= 0, new_index[np.maximum(parents[keep], 0)], -1)
        return tokens[keep].tolist(), new_parents.tolist()

    def expand_scored(self, root: int, layout: TemplateLayout, max_depth: int | None = None,
                      prev: int = -1) -> tuple[list[int], list[int], list[float]]:
        """`expand` with each node's stored probability in its parent's row (0 for the root): the raw score a
        hybrid tree calibrates."""
        tokens, parents = self.expand(root, layout, max_depth, prev)
        if len(tokens) == 1:
            return tokens, parents, [0.0]
        tok, up = np.array(tokens), np.array(parents[1:])
        before = np.array([prev] + [tokens[p] for p in parents[1:]])  # the token before each node
        succ, probs = self.rows(before[up], tok[up])  # each node's parent's row
        match = succ == tok[1:, None]
        return tokens, parents, [0.0] + (probs * match).sum(axis=1).tolist()

    def expand_many(self, roots: list[int], prevs: list[int], layout: TemplateLayout,
                    max_depth: int | None = None) -> list[tuple[list[int], list[int], list[float]]]:
        """`expand_scored` for every (root, prev) pair: one compiled call for the whole batch where the kernels
        are built (recycle_matrix.cpp), the numpy reference above elsewhere."""
        if not self.uses_kernels():
            return [self.expand_scored(root, layout, max_depth, prev) for root, prev in zip(roots, prevs)]
        levels = layout.levels if max_depth is None else layout.levels[:max_depth]
        count = 1 + sum(int(level.shape[0]) for level in levels)
        tokens, parents, scores, counts = cpu_kernels.recycle_expand(
            self._views, self.pair_bits, torch.tensor(roots, dtype=torch.int64), torch.tensor(prevs, dtype=torch.int64),
            torch.from_numpy(layout.parents), torch.from_numpy(layout.ranks), count)
        out = []
        for t, p, sc, n in zip(tokens.tolist(), parents.tolist(), scores.tolist(), counts.tolist()):
            out.append((t[:n], p[:n], sc[:n]))
        return out

    def expand_best_first(self, root: int, budget: int, max_depth: int, min_prob: float = 0.0,
                          width: int | None = None, prev: int = -1) -> tuple[list[int], list[int], list[float]]:
        """The `budget` nodes of highest path probability (product of stored probabilities), root first.

        Returns tokens, parents and each node's stored (conditional) probability. `width` caps the ranks a
        node may offer; nodes whose path probability falls below `min_prob` are left out. A child never beats
        its parent (probabilities are at most 1), so growing best-first from the root keeps parents first.
        `prev` is the token before the root (for pair rows).
        """
        width = self.k if width is None else min(width, self.k)
        tokens, parents, scores, depth = [root], [-1], [0.0], [0]
        heap: list[tuple[float, int, int, int, float]] = []  # (-path prob, order, token, parent node, prob)
        order = itertools.count()

        def offer(node: int, path: float) -> None:
            before = tokens[parents[node]] if node else prev
            succ, probs = self.rows(np.array([before]), np.array([tokens[node]]))
            for t, p in zip(succ[0, :width].tolist(), probs[0, :width].tolist()):
                if t < 0 or p <= 0.0 or path * p < min_prob:
                    break  # ranks are best first: the rest are no better
                heapq.heappush(heap, (-path * p, next(order), t, node, p))

        offer(0, 1.0)
        while heap and len(tokens) - 1 < budget:
            neg, _, token, parent, p = heapq.heappop(heap)
            tokens.append(token)
            parents.append(parent)
            scores.append(p)
            depth.append(depth[parent] + 1)
            if depth[-1] < max_depth:
                offer(len(tokens) - 1, -neg)
        return tokens, parents, scores

    def expand_best_first_many(self, roots: list[int], prevs: list[int], budget: int, max_depth: int,
                               min_prob: float = 0.0, width: int | None = None
                               ) -> list[tuple[list[int], list[int], list[float]]]:
        """`expand_best_first` for every (root, prev) pair: one compiled call for the whole batch where the
        kernels are built (recycle_matrix.cpp), the heap above elsewhere."""
        if not self.uses_kernels():
            return [self.expand_best_first(root, budget, max_depth, min_prob, width, prev)
                    for root, prev in zip(roots, prevs)]
        tokens, parents, scores, counts = cpu_kernels.recycle_best_first(
            self._views, self.pair_bits, torch.tensor(roots, dtype=torch.int64), torch.tensor(prevs, dtype=torch.int64),
            budget, max_depth, min_prob, self.k if width is None else width)
        return [(t[:n], p[:n], sc[:n]) for t, p, sc, n in zip(tokens.tolist(), parents.tolist(), scores.tolist(),
                                                              counts.tolist())]


def _last_occurrences(values: np.ndarray) -> np.ndarray:
    """Indices of the last occurrence of each distinct value, in ascending order of value.

    A verified step writes a handful of rows, where `np.unique`'s sort costs 70 us a call (two calls a step,
    a quarter of recycle's bookkeeping on the default model); a dict does it in a few. Prompt seeds and wide
    batches take the sort."""
    if values.shape[0] <= 64:
        last = {v: i for i, v in enumerate(values.tolist())}
        return np.array([last[v] for v in sorted(last)], dtype=np.int64)
    _, first_in_reversed = np.unique(values[::-1], return_index=True)
    return values.shape[0] - 1 - first_in_reversed
