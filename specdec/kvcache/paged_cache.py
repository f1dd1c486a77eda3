"""Paged KV cache: per-layer K/V tensors, and per-sequence block tables over a shared block pool.

Layout per layer: `[num_blocks, block_size, kv_heads, head_dim]`, the layout vLLM and FlashInfer use: one
token's K (or V) for all heads is contiguous, so writing a new token is one row copy, and a block is one
contiguous chunk that a kernel reads with a single base pointer.

The cache knows nothing about trees. Tree verification appends scratch slots, then `copy` compacts the
accepted path into place and `truncate` drops the rest; both are plain operations on a sequence's table.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec import kernels
from specdec.kernels.reference import gather_kv
from specdec.kvcache.block_pool import BlockPool
from specdec.kvcache.prefix_cache import PrefixCache


@dataclass
class BlockTable:
    """One sequence's view of the cache: the blocks holding its tokens, in order, and how many tokens."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0
    cached: list[tuple[int, int]] = field(default_factory=list)  # (chain hash, cache entry id) per full block,
    # for the leading blocks the prefix cache has seen (kept by `PrefixCache`; empty without prefix caching)

    def slot(self, position: int, block_size: int) -> int:
        return self.blocks[position // block_size] * block_size + position % block_size


class PagedKVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        prefix_caching: bool = False,
        scratch: bool = False,
    ) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.prefix = PrefixCache(self.pool, block_size) if prefix_caching else None
        # `scratch`: one block past the pool's, never handed out, where padding rows of a CUDA graph's step write
        # their K/V (engine/cuda_graphs.py).
        self.scratch_slot = num_blocks * block_size if scratch else None
        shape = (num_blocks + int(scratch), block_size, kv_heads, head_dim)
        self.layers: list[tuple[Tensor, Tensor]] = [
            (_zeros(shape, dtype, device), _zeros(shape, dtype, device)) for _ in range(num_layers)
        ]

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def dtype(self) -> torch.dtype:
        """What K and V are stored in."""
        return self.layers[0][0].dtype

    def blocks_needed(self, table: BlockTable, n: int) -> int:
        """Fresh blocks `append(table, n)` would take (counting a copy-on-write of a shared last block)."""
        bs = self.block_size
        needed = -(-(table.length + n) // bs) - len(table.blocks)
        if table.length % bs and n and self.pool.ref_count(table.blocks[-1]) > 1:
            needed += 1
        return max(needed, 0)

    def can_append(self, table: BlockTable, n: int) -> bool:
        return self.blocks_needed(table, n) <= self.pool.num_free

    def append(self, table: BlockTable, n: int) -> list[int] | None:
        """Reserve `n` more positions; returns their slots, or None (changing nothing) if blocks run out."""
        if not self.can_append(table, n):
            return None
        bs = self.block_size
        if table.length % bs and n and self.pool.ref_count(table.blocks[-1]) > 1:
            self._copy_on_write_last(table)
        extra = -(-(table.length + n) // bs) - len(table.blocks)
        if extra > 0:
            fresh = self.pool.allocate(extra)
            assert fresh is not None  # checked by can_append
            table.blocks.extend(fresh)
        start = table.length
        table.length += n
        return [table.slot(p, bs) for p in range(start, start + n)]

    def _copy_on_write_last(self, table: BlockTable) -> None:
        """A forked sequence is about to write into a block it shares: give it its own copy first."""
        shared = table.blocks[-1]
        (own,) = self.pool.allocate(1) or [None]
        assert own is not None
        used = table.length % self.block_size
        src = torch.arange(used) + shared * self.block_size
        dst = torch.arange(used) + own * self.block_size
        self.copy_slots(src.tolist(), dst.tolist())
        self.pool.release(shared)
        table.blocks[-1] = own

    def truncate(self, table: BlockTable, length: int) -> None:
        """Roll back to the first `length` tokens; whole blocks past the end go back to the pool (still cached:
        their K/V is intact), and the table forgets the cache entries of every block no longer full."""
        if length > table.length:
            raise ValueError(f"cannot truncate a sequence of {table.length} tokens to {length}")
        keep = -(-length // self.block_size)
        if self.prefix is not None and length % self.block_size and self.pool.ref_count(table.blocks[keep - 1]) == 1:
            # The cut falls inside a block only this table holds: the next append overwrites part of it in place,
            # so the prefix cache must stop offering it for the tokens it held (a shared one is copied first).
            self.prefix.forget(table.blocks[keep - 1])
        for block in table.blocks[keep:]:
            self.pool.release(block)
        del table.blocks[keep:]
        del table.cached[length // self.block_size:]
        table.length = length

    def copy_slots(self, src_slots: list[int], dst_slots: list[int]) -> None:
        """Copy K/V between slots in every layer: compaction of an accepted tree path."""
        if not src_slots:
            return
        device = self.layers[0][0].device
        src = torch.tensor(src_slots, dtype=torch.int64, device=device)
        dst = torch.tensor(dst_slots, dtype=torch.int64, device=device)
        kernels.copy_kv_layers(self.layers, src, dst)

    def fork(self, table: BlockTable) -> BlockTable:
        """A new table sharing every block of `table`; the first write into a shared partial block copies it."""
        for block in table.blocks:
            self.pool.share(block)
        return BlockTable(blocks=list(table.blocks), length=table.length, cached=list(table.cached))

    def free(self, table: BlockTable) -> None:
        self.truncate(table, 0)

    def gather(self, table: BlockTable, layer: int) -> tuple[Tensor, Tensor]:
        """A sequence's K and V for one layer as dense `[length, kv_heads, head_dim]` (tests, debugging)."""
        k_cache, v_cache = self.layers[layer]
        blocks = torch.tensor(table.blocks, dtype=torch.int64)
        return gather_kv(k_cache, blocks, table.length), gather_kv(v_cache, blocks, table.length)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """Zeros whose pages the CPU fills only when first touched.

    `torch.zeros` on the CPU writes every byte up front: 1.5 GB for the default 32k-token cache of the default
    model, 2-13 s of every start-up on a shared 2-core machine (issue 18). An anonymous private mapping is
    zero pages the kernel supplies on first touch, so a cache costs only what requests actually use.

    Not numpy's calloc: numpy marks every large buffer MADV_HUGEPAGE, and on a machine whose memory is
    fragmented each first touch of such a buffer may stall in direct compaction for a 2 MB page. Measured on
    the default model (17 dev prompts, suffix drafter): 1.5 s of system time in 30-1000 ms stalls mid-decode,
    gone with this mapping. The mapping gets whatever the system's transparent-huge-page policy gives
    unadvised memory (none under the usual `madvise` setting).
    """
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = torch.empty((), dtype=dtype).element_size()
    for n in shape:
        count *= n
    raw = mmap.mmap(-1, max(count, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(raw, dtype=torch.uint8, count=count).view(dtype).view(shape)
