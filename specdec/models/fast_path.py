"""The CPU fast path of `LlamaModel.forward`: ten calls per layer instead of about eighty torch ops.

A decode step of a small model on CPU pays a few microseconds for every op it dispatches, and the plain
forward (specdec/models/llama.py, the reference this path is tested against) dispatches about eighty per
layer around its four matmuls: norms, rotary embedding, the K/V writes, the gather and masking of
attention, the activation and, for int8, five ops of activation quantization per linear. Here each layer is:

    rms_norm (+ previous residual) -> qkv -> rope_kv (rotates q, k; writes k, v) -> paged_attention
    -> quantize -> o_proj -> rms_norm (+ residual) -> gate_up -> silu_mul -> down

with the fused kernels of specdec.kernels.cpu. Each kernel writes its output in the form the next linear
takes (`input_form`): float for a float linear; int8 rows with their scales for a QLinear; rows divided by their
max |x| for an fbgemm Int8DynamicLinear, whose output row scale the kernel after it applies. The residual add
of a sublayer is done by the next norm. Every kernel works row by row, and the attention kernel has a fixed reduction
order per row, so a row's result does not depend on its batch (the int8 contract, tests/engine).

Used when the compiled kernels are available, the model is float32 on CPU and the cache is float32; the
plain forward serves everything else.
"""

from __future__ import annotations

import operator

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from specdec.kernels import cpu as cpu_kernels
from specdec.kernels.reference import FLOAT, Q8, ROWSCALE
from specdec.models.context import AttentionContext
from specdec.models.qlinear import QLinear
from specdec.models.quant import Int8DynamicLinear

if TYPE_CHECKING:
    from specdec.models.llama import ForwardOutput, LlamaModel


def applies(model: "LlamaModel", kv_caches: list[tuple[Tensor, Tensor]]) -> bool:
    """A float32 model on CPU, with a float32 cache, or a bfloat16 one where the AMX tiles take it."""
    cache = kv_caches[0][0].dtype
    return (model.dtype == torch.float32 and model.device.type == "cpu" and cpu_kernels.available()
            and (cache == torch.float32 or (cache == torch.bfloat16 and cpu_kernels.bf16_attention())))


def input_form(linear: nn.Module, bias_ok: bool = False) -> int:
    """The input form a linear takes (specdec.kernels.reference: FLOAT, ROWSCALE or Q8). An fbgemm layer's
    bias cannot be deferred past its output scale, so only qkv (rope_kv adds its bias) may have one."""
    if isinstance(linear, QLinear):
        return Q8
    if isinstance(linear, Int8DynamicLinear) and linear.per_token and (bias_ok or linear.bias is None):
        return ROWSCALE
    return FLOAT


def project(linear: nn.Module, act: list[Tensor], form: int) -> tuple[Tensor, Tensor | None]:
    """The linear's output, and the row scale it still needs (fbgemm layers) or None."""
    if form == Q8:
        return linear.forward_q8(act), None
    if form == ROWSCALE:
        return linear.forward_unit_rows(act[0]), act[1]
    return linear.forward(act[0]), None


def attend_and_mlp(attn: nn.Module, mlp: nn.Module, post_norm: nn.Module, act: list[Tensor], form: int,
                   residual: Tensor, positions: Tensor, ctx: AttentionContext, cache: tuple[Tensor, Tensor],
                   rope: nn.Module, num_heads: int, num_kv_heads: int) -> tuple[Tensor, Tensor | None]:
    """One layer from qkv's input (`act`, in `form`) to down's output and the row scale it still needs:

        qkv -> rope_kv (rotates q, k; writes k, v) -> paged_attention -> o_proj
        -> post_norm (adds o_proj's output to `residual` in place) -> gate_up -> silu_mul -> down

    The target's layers and the EAGLE predictor's layer (specdec/drafters/heads/eagle_fast.py) differ only
    before qkv and after down, so both run this. `attn` has `qkv_proj`, `o_proj` and `scale`; `mlp` has
    `gate_up_proj` and `down_proj`."""
    k_cache, v_cache = cache
    qkv, scale = project(attn.qkv_proj, act, form)
    bias = attn.qkv_proj.bias if form == ROWSCALE else None  # the other forms added their own
    q = cpu_kernels.rope_kv(qkv, scale, bias, positions, rope.cos, rope.sin, k_cache, v_cache, ctx.slot_mapping,
                            num_heads, num_kv_heads)
    out = cpu_kernels.paged_attention(q, k_cache, v_cache, ctx.block_tables, ctx.prefix_lens, ctx.query_start_loc,
                                      ctx.tree_mask, attn.scale)
    form = input_form(attn.o_proj)
    act = [out.view(out.shape[0], -1)] if form == FLOAT else cpu_kernels.quantize(out, form)
    y, scale = project(attn.o_proj, act, form)
    form = input_form(mlp.gate_up_proj)
    act = cpu_kernels.rms_norm(residual, post_norm.weight, post_norm.eps, form, y, scale)
    gate_up, scale = project(mlp.gate_up_proj, act, form)
    form = input_form(mlp.down_proj)
    return project(mlp.down_proj, cpu_kernels.silu_mul(gate_up, scale, form), form)


# A [3] float64 tensor under "decode_layers" makes the one-call path add its seconds in linears, attention and the
# rest to it (bench/profile_step.py); empty otherwise.
TIMINGS: dict[str, Tensor] = {}


def linear_params(linear: nn.Module) -> tuple[int, list[Tensor | None]] | None:
    """(kind, [a, b, c, bias]) of a linear for decode_layers, or None if it has no such form (fbgemm)."""
    if isinstance(linear, QLinear):
        if linear.bits != 4:  # kind 8 or 7: the weight bits
            return linear.bits, [linear.weight, linear.weight_scale, linear.weight_blocks, linear.bias]
        return 4, [linear.weight, linear.d, linear.m_t, linear.bias]
    if type(linear) is nn.Linear:
        return 0, [linear.weight, None, None, linear.bias]
    return None


def _one_call_plan(model: "LlamaModel", num_layers: int) -> object | None:
    """decode_layers' weights for these layers (None if a layer has no such form), cached on the model while
    its linears and norm weights stay the same objects: quantizing replaces them, which the check below sees.
    The check reads the module dicts directly (nn.Module attribute access would cost a millisecond a step)."""
    cached = getattr(model, "_fast_path_plan", None)
    if cached is not None and cached[0] == num_layers:
        dicts, names, objects = cached[1]
        if all(map(operator.is_, map(dict.get, dicts, names), objects)):  # in C: 180 lookups, no Python frames
            return cached[2]
    layers = list(model.layers)[:num_layers]
    slots = []  # (dict, key, object) for every linear and norm weight the plan holds
    params: list[Tensor | None] = []
    kinds: list[int] = []
    weights = None
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            slots.append((norm._parameters, "weight", norm.weight))
            params.append(norm.weight)
        for owner, name in ((attn, "qkv_proj"), (attn, "o_proj"), (mlp, "gate_up_proj"), (mlp, "down_proj")):
            linear = owner._modules[name]
            slots.append((owner._modules, name, linear))
            entry = linear_params(linear)
            if entry is None:
                break
            kinds.append(entry[0])
            params += entry[1]
        else:
            continue
        break
    else:
        weights = cpu_kernels.layer_weights(params, kinds)
    object.__setattr__(model, "_fast_path_plan", (num_layers, tuple(zip(*slots)) or ((), (), ()), weights))
    return weights


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
    # A list, not `model.layers[:n]`: slicing a ModuleList builds a new one (30 add_module calls a step).
    layers = list(model.layers)[: num_layers or len(model.layers)]
    weights = None if capture_layers else _one_call_plan(model, len(layers))
    if weights is not None:  # every layer in one C++ call
        k_caches, v_caches = [k for k, _ in kv_caches[: len(layers)]], [v for _, v in kv_caches[: len(layers)]]
        hidden = cpu_kernels.decode_layers(x, positions, ctx.slot_mapping, ctx.block_tables, ctx.prefix_lens,
                                           ctx.query_start_loc, ctx.tree_mask, rope.cos, rope.sin, k_caches, v_caches,
                                           weights, model.norm.weight, c.num_heads, c.num_kv_heads, c.rms_eps,
                                           layers[0].self_attn.scale, TIMINGS.get("decode_layers"))
        rows = hidden if logits_rows is None else hidden.index_select(0, logits_rows)
        logits = model.lm_head(rows).float() if rows.shape[0] else None
        return ForwardOutput(logits=logits, hidden=hidden if return_hidden else None, layer_inputs={})
    pending: Tensor | None = None  # the last sublayer's output, not yet added to x
    pending_scale: Tensor | None = None  # its row scale (fbgemm int8), or None
    captured: dict[int, Tensor] = {}
    for index, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        if index in capture_layers:
            if pending is not None:
                x.add_(pending * pending_scale if pending_scale is not None else pending)
                pending = pending_scale = None
            captured[index] = x.clone()
        form = input_form(attn.qkv_proj, bias_ok=True)
        act = cpu_kernels.rms_norm(x, layer.input_layernorm.weight, layer.input_layernorm.eps, form, pending,
                                   pending_scale)
        pending, pending_scale = attend_and_mlp(attn, mlp, layer.post_attention_layernorm, act, form, x, positions,
                                                ctx, kv_caches[index], rope, c.num_heads, c.num_kv_heads)
    (hidden,) = cpu_kernels.rms_norm(x, model.norm.weight, model.norm.eps, FLOAT, pending, pending_scale)
    rows = hidden if logits_rows is None else hidden.index_select(0, logits_rows)
    logits = model.lm_head(rows).float() if rows.shape[0] else None
    return ForwardOutput(logits=logits, hidden=hidden if return_hidden else None, layer_inputs=captured)
