"""Prefix caching: full KV blocks are found again by their content, so a shared prefix is prefilled once.

Each full block of a sequence is named by a hash chained over the token ids of every block up to it
(`hash((parent_hash, tokens))`), so equal hashes mean "the same tokens after the same prefix". A hit is
confirmed, never trusted: the stored block must hold the same token ids *and* follow the very cache entry that
the previous block matched (entries carry unique ids that are never reused), so a hash collision cannot hand a
sequence someone else's K/V.

Cached blocks cost nothing: a block stays cached after its last sequence frees it, sitting in the pool's free
queue, and is evicted (least recently freed first) only when the pool hands it out for new data. A request that
arrives before then revives it and skips that part of its prefill. Only whole blocks of tokens whose K/V is
final are cached: committed prompt or output tokens, never tree scratch slots.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from specdec.kvcache.block_pool import BlockPool


@dataclass(frozen=True)
class _Entry:
    entry_id: int
    chain_hash: int
    parent_id: int  # entry id of the block before it (0 for a sequence's first block)
    tokens: tuple[int, ...]


class PrefixCache:
    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self._block_of: dict[int, int] = {}  # chain hash -> block
        self._entry_of: dict[int, _Entry] = {}  # block -> what it holds
        self._ids = itertools.count(1)
        self.queried_tokens = 0  # prompt tokens looked up at admission
        self.hit_tokens = 0  # of those, found in the cache
        pool.on_evict = self._evict

    @property
    def num_cached_blocks(self) -> int:
        return len(self._entry_of)

    def match(self, table, tokens: list[int], limit: int) -> int:
        """Attach the cached blocks of the longest cached prefix of `tokens[:limit]` to an empty `table`.

        Returns the number of tokens matched (a multiple of the block size); each matched block gains a
        reference, so the caller frees the table as usual.
        """
        if table.length or table.blocks:
            raise ValueError("prefix matching needs an empty block table")
        bs = self.block_size
        parent_hash, parent_id = 0, 0
        for i in range(max(limit, 0) // bs):
            chunk = tuple(tokens[i * bs: (i + 1) * bs])
            chain_hash = hash((parent_hash, chunk))
            block = self._block_of.get(chain_hash)
            entry = self._entry_of.get(block) if block is not None else None
            if entry is None or entry.parent_id != parent_id or entry.tokens != chunk:
                break
            self.pool.revive(block)
            table.blocks.append(block)
            table.cached.append((chain_hash, entry.entry_id))
            parent_hash, parent_id = chain_hash, entry.entry_id
        table.length = len(table.blocks) * bs
        return table.length

    def count_query(self, queried: int, hit: int) -> None:
        self.queried_tokens += queried
        self.hit_tokens += hit

    def register(self, table, tokens: list[int]) -> None:
        """Cache every full block of `table` not cached yet; `tokens[p]` is the token at cache position p."""
        bs = self.block_size
        for i in range(len(table.cached), table.length // bs):
            chunk = tuple(tokens[i * bs: (i + 1) * bs])
            parent_hash, parent_id = table.cached[-1] if table.cached else (0, 0)
            chain_hash = hash((parent_hash, chunk))
            block = self._block_of.get(chain_hash)
            entry = self._entry_of.get(block) if block is not None else None
            if entry is not None and entry.parent_id == parent_id and entry.tokens == chunk:
                table.cached.append((chain_hash, entry.entry_id))  # computed twice; our copy stays private
                continue
            entry_id = next(self._ids)
            if block is None and table.blocks[i] not in self._entry_of:
                self._block_of[chain_hash] = table.blocks[i]
                self._entry_of[table.blocks[i]] = _Entry(entry_id, chain_hash, parent_id, chunk)
            # On a hash collision the block stays uncached, but the chain goes on with a fresh id, so no later
            # block of this sequence can ever be confused with the colliding one's children.
            table.cached.append((chain_hash, entry_id))

    def forget(self, block: int) -> None:
        """Stop offering `block`: its owner is about to overwrite part of it (a truncate into a full block)."""
        self._evict(block)

    def _evict(self, block: int) -> None:
        entry = self._entry_of.pop(block, None)
        if entry is not None and self._block_of.get(entry.chain_hash) == block:
            del self._block_of[entry.chain_hash]
