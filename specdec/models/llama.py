"""Our llama-family transformer: Llama 2/3, Mistral, Qwen2/2.5 and SmolLM2 in one module.

It is written for the engine, not for training: projections are fused (one qkv and one gate/up matmul per
layer, fewer calls per step), K/V go straight into the paged cache through the kernel dispatch point, and
logits are computed only for the rows the caller asks for (a prefill needs one row, a tree needs all).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdec import kernels
from specdec.models import fast_path
from specdec.models.config import ModelConfig
from specdec.models.context import AttentionContext
from specdec.models.rope import RotaryEmbedding


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32 like the reference implementations, so bf16/fp16 models match them.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.qkv_proj = nn.Linear(config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=False)
        self.scale = config.head_dim**-0.5

    def forward(
        self, x: Tensor, positions: Tensor, ctx: AttentionContext, rope: RotaryEmbedding, cache: tuple[Tensor, Tensor]
    ) -> Tensor:
        c = self.config
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.view(-1, c.num_heads, c.head_dim)
        k = k.view(-1, c.num_kv_heads, c.head_dim)
        v = v.view(-1, c.num_kv_heads, c.head_dim)
        q, k = rope(positions, q, k)
        k_cache, v_cache = cache
        kernels.write_kv(k, v, k_cache, v_cache, ctx.slot_mapping)
        if ctx.decode_only:
            out = kernels.decode_attention(q, k_cache, v_cache, ctx.block_tables, ctx.seq_lens, self.scale,
                                           ctx.workspace)
        else:
            out = kernels.paged_attention(q, k_cache, v_cache, ctx.block_tables, ctx.prefix_lens,
                                          ctx.query_start_loc, ctx.tree_mask, self.scale, ctx.workspace)
        return self.o_proj(out.reshape(-1, c.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: Tensor, positions: Tensor, ctx: AttentionContext, rope: RotaryEmbedding, cache: tuple[Tensor, Tensor]
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx, rope, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass(frozen=True)
class ForwardOutput:
    logits: Tensor | None  # [R, vocab] float32 for the requested rows
    hidden: Tensor | None  # [T, hidden] final-norm hidden states, when asked for
    layer_inputs: dict[int, Tensor]  # residual stream entering each requested layer, [T, hidden]


class LlamaModel(nn.Module):
    """Token ids + positions + attention context -> logits (and hidden states on request)."""

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(config, device)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def kv_cache_dtype(self) -> torch.dtype:
        """What the K/V cache is allocated in: the config's `kv_cache_dtype`, else the weights' dtype."""
        name = self.config.kv_cache_dtype
        return getattr(torch, name) if name else self.dtype

    def cache_dtype(self, choice: str = "auto") -> torch.dtype:
        """The K/V cache dtype for an engine's `EngineConfig.kv_cache_dtype`: "auto" is the model's own."""
        return self.kv_cache_dtype if choice == "auto" else getattr(torch, choice)

    def forward(
        self,
        input_ids: Tensor,  # [T] int64
        positions: Tensor,  # [T] int64
        ctx: AttentionContext,
        kv_caches: list[tuple[Tensor, Tensor]],  # one (k_cache, v_cache) per layer
        logits_rows: Tensor | None = None,  # [R] rows to compute logits for; None = all rows
        return_hidden: bool = False,
        capture_layers: tuple[int, ...] = (),
        num_layers: int | None = None,  # run only the first layers (early-exit self-drafting)
    ) -> ForwardOutput:
        if fast_path.applies(self, kv_caches):
            return fast_path.forward(self, input_ids, positions, ctx, kv_caches, logits_rows, return_hidden,
                                     capture_layers, num_layers)
        x = self.embed_tokens(input_ids)
        captured: dict[int, Tensor] = {}
        for index, layer in enumerate(self.layers[: num_layers or len(self.layers)]):
            if index in capture_layers:
                captured[index] = x
            x = layer(x, positions, ctx, self.rope, kv_caches[index])
        hidden = self.norm(x)
        rows = hidden if logits_rows is None else hidden.index_select(0, logits_rows)
        logits = self.lm_head(rows).float() if rows.shape[0] else None
        return ForwardOutput(logits=logits, hidden=hidden if return_hidden else None, layer_inputs=captured)
