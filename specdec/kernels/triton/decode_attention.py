"""Plain decode (one query per sequence) over the paged KV cache: `reference.decode_attention` on the GPU.

Decode is the case where split-K matters most: a small batch over a long context gives `B * kv_heads`
programs, far fewer than the GPU's SMs, each walking the whole context. `attention.py` then partitions the
context across programs and merges their partial softmax states in a second kernel (flash-decoding); the split
count follows the context capacity of the block table and the batch size (`attention.choose_splits`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec.kernels.triton.attention import Allocator, AttentionTuning, attention


def decode_attention(
    q: Tensor,  # [B, q_heads, head_dim]; one query per sequence
    k_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: Tensor,
    block_tables: Tensor,  # [B, max_blocks] int32
    seq_lens: Tensor,  # [B] int32; tokens to attend to, the query's own (already written) token included
    scale: float,
) -> Tensor:  # [B, q_heads, head_dim]
    """One query per sequence over its whole paged context, split-K when the batch alone cannot fill the GPU."""
    return decode_attention_tuned(q, k_cache, v_cache, block_tables, seq_lens, scale, AttentionTuning())


def decode_attention_tuned(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float,
    tuning: AttentionTuning,
    alloc: Allocator = torch.empty,
) -> Tensor:
    """`decode_attention` with launch choices forced (tests, benchmarks): the token is new token 0 after
    `seq_lens - 1` committed ones, so the shared kernel's causal path applies unchanged."""
    starts = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return attention(
        q, k_cache, v_cache, block_tables, seq_lens - 1, starts, None, scale, tuning=tuning, alloc=alloc
    )
