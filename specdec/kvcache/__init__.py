"""Paged KV cache: a block pool with reference counts, per-layer cache tensors, per-sequence block tables."""

from specdec.kvcache.block_pool import BlockPool
from specdec.kvcache.paged_cache import BlockTable, PagedKVCache
from specdec.kvcache.prefix_cache import PrefixCache

__all__ = ["BlockPool", "BlockTable", "PagedKVCache", "PrefixCache"]
