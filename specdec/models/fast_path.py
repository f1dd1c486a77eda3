"""The CPU fast path of `LlamaModel.forward`: ten calls per layer instead of about eighty torch ops.

A decode step of a small model on CPU pays a few microseconds for every op it dispatches, and the plain
forward (specdec/models/llama.py, the reference this path is tested against) dispatches about eighty per
layer around its four matmuls: norms, rotary embedding, the K/V writes, the gather and masking of
attention, the activation and, for int8, five ops of activation quantization per linear. Here each layer is:

    rms_norm (+ previous residual) -> qkv -> rope_kv (rotates q, k; writes k, v) -> paged_attention
    -> row_scale -> o_proj -> rms_norm (+ residual) -> gate_up -> silu_mul -> down

with the fused kernels of specdec.kernels.cpu. An int8 linear takes its input in row-scaled form (rows
divided by their max |x|, see Int8DynamicLinear.forward_unit_rows), which the kernel before it produces in
the same pass, and its output row scale is applied by the kernel after it; the residual add of a sublayer
is done by the next norm. Every kernel works row by row, and the attention kernel has a fixed reduction
order per row, so a row's result does not depend on its batch (the int8 contract, tests/engine).

Used when the compiled kernels are available, the model is float32 on CPU and the cache is float32; the
plain forward serves everything else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from specdec.kernels import cpu as cpu_kernels
from specdec.models.context import AttentionContext
from specdec.models.quant import Int8DynamicLinear

if TYPE_CHECKING:
    from specdec.models.llama import ForwardOutput, LlamaModel


def applies(model: "LlamaModel", kv_caches: list[tuple[Tensor, Tensor]]) -> bool:
    return (model.dtype == torch.float32 and model.device.type == "cpu" and kv_caches[0][0].dtype == torch.float32
            and cpu_kernels.available())


def _int8(linear: nn.Module, bias_ok: bool = False) -> bool:
    """An int8 linear that takes row-scaled input; only qkv may have a bias (rope_kv adds it)."""
    return isinstance(linear, Int8DynamicLinear) and linear.per_token and (bias_ok or linear.bias is None)


def _project(linear: nn.Module, x: Tensor, int8: bool) -> Tensor:
    """The linear's output; for an int8 linear, x is row-scaled and the output still needs its row scale."""
    return linear.forward_unit_rows(x) if int8 else linear.forward(x)


def forward(
    model: "LlamaModel",
    input_ids: Tensor,
    positions: Tensor,
    ctx: AttentionContext,
    kv_caches: list[tuple[Tensor, Tensor]],
    logits_rows: Tensor | None,
    return_hidden: bool,
    capture_layers: tuple[int, ...],
    num_layers: int | None,
) -> "ForwardOutput":
    from specdec.models.llama import ForwardOutput

    c = model.config
    rope = model.rope
    x = model.embed_tokens(input_ids)
    pending: Tensor | None = None  # the last sublayer's output, not yet added to x
    pending_scale: Tensor | None = None  # its row scale (int8), or None
    captured: dict[int, Tensor] = {}
    for index, layer in enumerate(model.layers[: num_layers or len(model.layers)]):
        attn, mlp = layer.self_attn, layer.mlp
        if index in capture_layers:
            if pending is not None:
                x.add_(pending * pending_scale if pending_scale is not None else pending)
                pending = pending_scale = None
            captured[index] = x.clone()
        k_cache, v_cache = kv_caches[index]
        qkv_int8 = _int8(attn.qkv_proj, bias_ok=True)
        h, scale = cpu_kernels.rms_norm(x, layer.input_layernorm.weight, layer.input_layernorm.eps, qkv_int8,
                                        pending, pending_scale)
        qkv = _project(attn.qkv_proj, h, qkv_int8)
        bias = attn.qkv_proj.bias if qkv_int8 else None  # a float linear has added its own
        q = cpu_kernels.rope_kv(qkv, scale, bias, positions, rope.cos, rope.sin, k_cache, v_cache, ctx.slot_mapping,
                                c.num_heads, c.num_kv_heads)
        out = cpu_kernels.paged_attention(q, k_cache, v_cache, ctx.block_tables, ctx.prefix_lens, ctx.query_start_loc,
                                          ctx.tree_mask, attn.scale)
        o_int8, gate_up_int8, down_int8 = _int8(attn.o_proj), _int8(mlp.gate_up_proj), _int8(mlp.down_proj)
        if o_int8:
            out, scale = cpu_kernels.row_scale(out)
        else:
            out, scale = out.view(out.shape[0], -1), None
        y = _project(attn.o_proj, out, o_int8)
        h, h_scale = cpu_kernels.rms_norm(x, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.eps,
                                          gate_up_int8, y, scale)
        gate_up = _project(mlp.gate_up_proj, h, gate_up_int8)
        act, scale = cpu_kernels.silu_mul(gate_up, h_scale, down_int8)
        pending, pending_scale = _project(mlp.down_proj, act, down_int8), scale
    hidden, _ = cpu_kernels.rms_norm(x, model.norm.weight, model.norm.eps, False, pending, pending_scale)
    rows = hidden if logits_rows is None else hidden.index_select(0, logits_rows)
    logits = model.lm_head(rows).float() if rows.shape[0] else None
    return ForwardOutput(logits=logits, hidden=hidden if return_hidden else None, layer_inputs=captured)
