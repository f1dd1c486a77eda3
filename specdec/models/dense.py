"""A dense (cache-free) forward of our llama-family model, for training and for recomputing features.

Trainers run whole right-padded batches at once, and a feature drafter recomputes the target's features over a
prompt prefix the engine took from its prefix cache; neither needs the paged cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec.models.llama import LlamaModel


def dense_forward(model: LlamaModel, ids: Tensor, capture: dict[int, Tensor] | None = None) -> Tensor:
    """Final-norm hidden states [B, T, H] of a right-padded batch [B, T], causal attention, positions 0..T-1.

    The same modules as the engine's paged forward, without a cache: padding sits after every real token, so
    causal attention never lets a real token see it. If `capture` holds layer indices as keys, their values are
    replaced by the residual stream entering those layers (EAGLE-3's fused features).
    """
    c = model.config
    batch, length = ids.shape
    positions = torch.arange(length, device=ids.device).repeat(batch)
    x = model.embed_tokens(ids)
    for index, layer in enumerate(model.layers):
        if capture is not None and index in capture:
            capture[index] = x
        attn = layer.self_attn
        q, k, v = attn.qkv_proj(layer.input_layernorm(x)).split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q, k = model.rope(positions, q.reshape(-1, c.num_heads, c.head_dim), k.reshape(-1, c.num_kv_heads, c.head_dim))
        q = q.view(batch, length, c.num_heads, c.head_dim).transpose(1, 2)
        k = k.view(batch, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(batch, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scale,
                                             enable_gqa=c.num_heads != c.num_kv_heads)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, length, c.q_size))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x)
