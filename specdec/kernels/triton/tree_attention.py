"""Tree attention / chunked prefill over the paged KV cache: `reference.paged_attention` on the GPU.

The kernel itself lives in `attention.py` (shared with decode); this module is the public entry point with
the reference's exact signature, so `dispatch.py` can swap backends without adapting arguments.
"""

from __future__ import annotations

from torch import Tensor

from specdec.kernels.triton.attention import attention


def paged_attention(
    q: Tensor,  # [T, q_heads, head_dim]
    k_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    block_tables: Tensor,  # [B, max_blocks] int32
    prefix_lens: Tensor,  # [B] int32; committed tokens before this step's new tokens
    query_start_loc: Tensor,  # [B + 1] int32
    tree_mask: Tensor | None,  # [T, W] int32 bit-packed, or None for causal
    scale: float,
) -> Tensor:  # [T, q_heads, head_dim]
    """Every new token over its sequence's paged prefix plus the new tokens the mask lets it see.

    Flash-style (no score matrix), one program per (query tile, kv head, prefix split); launch shape depends
    only on tensor shapes, never on their contents, so it needs no device-to-host sync."""
    return attention(q, k_cache, v_cache, block_tables, prefix_lens, query_start_loc, tree_mask, scale)
