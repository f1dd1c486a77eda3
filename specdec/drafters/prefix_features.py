"""The target's features over prefix-cached blocks, kept so that a drafter that reads them need not recompute them.

The engine's prefix cache skips the target forward over a prompt's cached blocks, and with it the features an
EAGLE predictor reads there. Recomputing them takes a dense target forward over the whole prefix, which costs
more than the prefill the cache saved where prompts come back (a chat client resends the history every turn, a
benchmark repeats its prompts, a preempted request starts over): `eagle` ran the test prompts a second time, four
at a time, at 0.56x of plain decode recomputing, 0.95x keeping them; and two-turn chats at 1.15x against 1.25x
(bench/prefix_features_ab.py, bench/results/prefix_features/).

So the drafter keeps the features of every full block it has seen, keyed by the prefix cache's entry id for
that block (`BlockTable.cached`): an entry names one exact chain of tokens (the cache confirms the tokens and
the parent entry of every hit) and its id is never reused, so a stored block is exactly the features the target
computed there. A request whose prefix was cached gets its features back whole, or, if any block was dropped,
the caller recomputes them as before. At most `max_blocks` blocks are kept, least recently used first out;
that is the KV pool's size, so it covers every prefix the cache can hold, at the features' share of a token's
K/V (5% for SmolLM2-135M in float32).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor

from specdec.kvcache import BlockTable


class PrefixFeatureStore:
    def __init__(self, block_size: int, max_blocks: int) -> None:
        self.block_size = block_size
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[int, Tensor] = OrderedDict()  # cache entry id -> [block_size, F]

    def __len__(self) -> int:
        return len(self._blocks)

    def put(self, entry_id: int, features: Tensor) -> None:
        self._blocks[entry_id] = features
        self._blocks.move_to_end(entry_id)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)

    def lookup(self, table: BlockTable, length: int) -> Tensor | None:
        """Features `[length, F]` of positions 0 .. length - 1, if `length` is a whole number of the table's
        cached blocks and every one is stored; else None."""
        blocks, rest = divmod(length, self.block_size)
        if rest or blocks > len(table.cached) or blocks == 0:
            return None
        found = []
        for _, entry_id in table.cached[:blocks]:
            features = self._blocks.get(entry_id)
            if features is None:
                return None
            self._blocks.move_to_end(entry_id)
            found.append(features)
        return torch.cat(found)


class FeatureLog:
    """One sequence's features from its first block not yet stored on, handed to the store block by block as soon
    as the prefix cache has named the block (it names a block once its K/V is final, a step after a prefill
    chunk's features arrive)."""

    def __init__(self, store: PrefixFeatureStore) -> None:
        self.store = store
        self.stored = 0  # blocks handed over (or passed over)
        self.tail: Tensor | None = None  # features of positions stored * block_size ..
        self.broken = False  # features came out of order: stop logging this sequence

    @property
    def position(self) -> int:
        return self.stored * self.store.block_size + (0 if self.tail is None else int(self.tail.shape[0]))

    def add(self, start: int, features: Tensor, table: BlockTable) -> None:
        """Features of positions `start ..`; a gap or an overlap ends the log (nothing wrong is ever stored)."""
        if self.broken:
            return
        if start != self.position:
            self.broken, self.tail = True, None
            return
        self.tail = features if self.tail is None else torch.cat([self.tail, features])
        self.flush(table)

    def flush(self, table: BlockTable) -> None:
        """Store every logged full block that the prefix cache has named."""
        bs = self.store.block_size
        while self.tail is not None and self.tail.shape[0] >= bs and self.stored < len(table.cached):
            self.store.put(table.cached[self.stored][1], self.tail[:bs].clone())
            self.tail = self.tail[bs:]
            self.stored += 1
