"""The EAGLE predictor: one decoder layer that extrapolates the target's features a token ahead.

EAGLE-1/2 (Li et al., 2024): the input at position t is the pair (target feature f_t, token x_{t+1}); the pair is
fused by `fc([embed(x_{t+1}) ; f_t])` (2H -> H, with a bias in the published checkpoints) and run through one
llama decoder layer whose input RMSNorm is absent (layer 0 of the published code has none). The output h_t is
a guess of f_{t+1}, the target's final-norm hidden state, so the target's own LM head reads it directly: the
published EAGLE-1/2 code applies `head(out_hidden)` with no norm in between, and we do the same (the
regression target f_{t+1} is already normalised).

EAGLE-3 (Li et al., 2025): the target feature is three residual streams (entering target layers 2, N//2, N-3),
fused by `fc` (3H -> H). The layer's attention reads `[input_layernorm(embed) ; hidden_norm(feature)]` (2H wide)
and adds its output to the (unnormalised) feature. A final `norm` and a *reduced-vocabulary* head follow; draft
id j stands for target id `j + d2t[j]`. On later draft steps the predictor's own output h (H wide) replaces the
fused feature and skips `fc`.

The module only computes; how attention reaches its keys is the caller's `attend(q, k, v)`: the drafter passes
one over its paged KV cache, the trainer one over dense (unrolled) sequences. So the same weights serve both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from specdec import kernels
from specdec.models.config import ModelConfig
from specdec.models.context import AttentionContext
from specdec.models.llama import MLP, RMSNorm
from specdec.models.rope import RotaryEmbedding

Attend = Callable[[Tensor, Tensor, Tensor], Tensor]  # q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq * D]


@dataclass(frozen=True)
class EagleConfig:
    layer: ModelConfig  # the decoder layer's shape (heads, rope, eps, q/k/v bias); vocab_size is the target's
    version: int  # 1 (EAGLE-1/2) or 3 (EAGLE-3)
    fc_bias: bool = True
    draft_vocab: int = 0  # EAGLE-3: rows of the reduced LM head
    num_features: int = 1  # target feature streams concatenated at the input (3 for EAGLE-3)

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden_size

    @property
    def fc_in(self) -> int:
        h = self.hidden_size
        return self.num_features * h if self.version == 3 else 2 * h


class EaglePredictor(nn.Module):
    def __init__(self, config: EagleConfig, device: torch.device | str = "cpu") -> None:
        super().__init__()
        c, h = config.layer, config.hidden_size
        self.config = config
        attn_in = 2 * h if config.version == 3 else h
        self.fc = nn.Linear(config.fc_in, h, bias=config.fc_bias)
        self.qkv_proj = nn.Linear(attn_in, c.q_size + 2 * c.kv_size, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.q_size, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, c.rms_eps)
        self.mlp = MLP(c)
        if config.version == 3:
            self.input_layernorm = RMSNorm(h, c.rms_eps)
            self.hidden_norm = RMSNorm(h, c.rms_eps)
            self.norm = RMSNorm(h, c.rms_eps)
            self.lm_head = nn.Linear(h, config.draft_vocab, bias=False)
            # draft id -> target id (published as the offsets d2t: target = j + d2t[j])
            self.register_buffer("draft_to_target", torch.arange(config.draft_vocab), persistent=False)
        self.rope = RotaryEmbedding(c, device)
        self.scale = c.head_dim**-0.5

    @property
    def device(self) -> torch.device:
        return self.post_attention_layernorm.weight.device  # a norm stays float whatever form the linears take

    def forward(self, embeds: Tensor, features: Tensor, positions: Tensor, attend: Attend) -> Tensor:
        """Predicted next features `[T, H]` for pairs (feature, token embedding) `[T, F]`, `[T, H]`.

        EAGLE-3 features are either target features (3H, through `fc`) or the predictor's own outputs (H)."""
        c, h = self.config.layer, self.config.hidden_size
        if self.config.version == 3:
            residual = self.fc(features) if features.shape[-1] != h else features
            x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(residual)], dim=-1)
        else:
            residual = x = self.fc(torch.cat([embeds, features.to(embeds.dtype)], dim=-1))
        q, k, v = self.qkv_proj(x).split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q, k = self.rope(positions, q.reshape(-1, c.num_heads, c.head_dim), k.reshape(-1, c.num_kv_heads, c.head_dim))
        out = attend(q, k, v.reshape(-1, c.num_kv_heads, c.head_dim))
        x = residual + self.o_proj(out)
        return x + self.mlp(self.post_attention_layernorm(x))

    def logits(self, hidden: Tensor, target_head: nn.Module) -> Tensor:
        """Float logits: over the target vocabulary (EAGLE-1/2, the target's head), or over the draft
        vocabulary (EAGLE-3; map ids with `draft_to_target`)."""
        if self.config.version == 3:
            return self.lm_head(self.norm(hidden)).float()
        return target_head(hidden).float()


def paged_attend(ctx: AttentionContext, cache: tuple[Tensor, Tensor], scale: float) -> Attend:
    """Attention over a paged KV cache: write the new K/V, then the dispatch kernels (as the target does)."""
    k_cache, v_cache = cache

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        kernels.write_kv(k, v, k_cache, v_cache, ctx.slot_mapping)
        if ctx.decode_only:
            out = kernels.decode_attention(q, k_cache, v_cache, ctx.block_tables, ctx.seq_lens, scale, ctx.workspace)
        else:
            out = kernels.paged_attention(q, k_cache, v_cache, ctx.block_tables, ctx.prefix_lens,
                                          ctx.query_start_loc, ctx.tree_mask, scale, ctx.workspace)
        return out.reshape(q.shape[0], -1)

    return attend
