"""The block pool: which KV blocks are free, and how many sequences share each one.

Plain Python, no tensors, so it is cheap to test exhaustively. Running out of blocks is an ordinary return
value (`None`), because the scheduler acts on it (waits, or preempts); it is never an exception.

Free blocks wait in least-recently-freed order. A freed block may still hold a cached prefix (see
`PrefixCache`): it counts as free, yet until it is handed out again a new request with the same prefix can
`revive` it instead of recomputing it. Handing it out evicts it from the prefix cache (`on_evict`), so cached
prefixes never cost the scheduler a single block.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("a block pool needs at least one block")
        self.num_blocks = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._refs = [0] * num_blocks
        self.on_evict: Callable[[int], None] | None = None  # told when a free block is reused for new data

    @property
    def num_free(self) -> int:
        return len(self._free)

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def allocate(self, n: int) -> list[int] | None:
        """Take `n` free blocks (each with one reference), or None, taking nothing, if fewer are free."""
        if n > len(self._free):
            return None
        blocks = [self._free.popitem(last=False)[0] for _ in range(n)]
        for block in blocks:
            self._refs[block] = 1
            if self.on_evict is not None:
                self.on_evict(block)
        return blocks

    def share(self, block: int) -> None:
        """Add a reference to a block already in use (fork, prefix sharing)."""
        if self._refs[block] <= 0:
            raise RuntimeError(f"block {block} is free and cannot be shared")
        self._refs[block] += 1

    def revive(self, block: int) -> None:
        """Take one reference on a block whether it is in use or free (a prefix-cache hit on a freed block)."""
        if self._refs[block] == 0:
            del self._free[block]
        self._refs[block] += 1

    def release(self, block: int) -> None:
        """Drop one reference; the block is free again when none remain."""
        if self._refs[block] <= 0:
            raise RuntimeError(f"block {block} released twice")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free[block] = None
