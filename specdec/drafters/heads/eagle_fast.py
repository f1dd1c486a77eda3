"""The EAGLE predictor's layer through the compiled CPU kernels, as the target's fast path runs its layers.

Drafting is the price of every EAGLE depth, and most of it was not arithmetic: the module path
(`EaglePredictor.forward` with `paged_attend`) dispatches about forty torch ops and nine module calls per
forward, around five small linears, so on the default model a drafted depth cost 1.5 ms of which the linears
were 0.6. Here the same layer is eight kernel calls:

    fc -> qkv -> rope_kv (rotates q, k; writes k, v) -> paged_attention -> o_proj
    -> rms_norm (adds o_proj's output to the residual first) -> gate_up -> silu_mul -> down

each handing the next linear its input in the form it takes (`specdec.models.fast_path.input_form`: int8 rows
for the drafter's int8 linears). From qkv to down it is the target's own layer body,
`specdec.models.fast_path.attend_and_mlp`. The arithmetic is the module path's up to float rounding (its reference:
tests/drafters/test_eagle_fast.py); a draft only proposes, so rounding can change which tokens are drafted,
never which are emitted. EAGLE-3 differs only at the input: its attention reads the two normalised halves
`[input_layernorm(embed) ; hidden_norm(feature)]`, and a feature already H wide (the predictor's own output, on
later depths) skips `fc`.

An EAGLE-1/2 predictor whose linears all have a kernel form (int8 QLinear or float, `fc` split by input) runs the
whole layer as one kernel call (`eagle_layer`, forward.cpp), the same functions in the same order: a drafted
level spent more in the Python and dispatch around eight kernel calls than in the kernels themselves.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor, nn

from specdec.kernels import cpu as cpu_kernels
from specdec.kernels.reference import FLOAT
from specdec.models.context import AttentionContext
from specdec.models.fast_path import attend_and_mlp, input_form, linear_params
from specdec.models.split_input import SplitInputLinear


def applies(predictor: nn.Module, embeds: Tensor, k_cache: Tensor) -> bool:
    """Float32 rows on CPU with a float32 cache and the compiled kernels built."""
    return (embeds.dtype == torch.float32 and embeds.device.type == "cpu" and k_cache.dtype == torch.float32
            and cpu_kernels.available())


def forward(predictor: nn.Module, embeds: Tensor, features: Tensor, positions: Tensor, ctx: AttentionContext,
            cache: tuple[Tensor, Tensor]) -> Tensor:
    """`EaglePredictor.forward` over the paged cache (`paged_attend`'s K/V writes included): `[T, H]`."""
    c = predictor.config.layer
    features = features.to(embeds.dtype)
    weights = _one_call_weights(predictor)
    if weights is not None:
        return cpu_kernels.eagle_layer(embeds, features, positions, ctx, cache, predictor.rope, weights,
                                       c.num_heads, c.num_kv_heads, predictor.post_attention_layernorm.eps,
                                       predictor.scale)
    if predictor.config.version == 3:
        if features.shape[-1] != predictor.config.hidden_size:
            residual = predictor.fc(features)
        else:  # the caller's tensor: the norm below adds into the residual in place
            residual = features.clone()
        (embed_norm,), (feature_norm,) = (
            cpu_kernels.rms_norm(x.contiguous(), norm.weight, norm.eps, FLOAT)
            for x, norm in ((embeds, predictor.input_layernorm), (residual, predictor.hidden_norm)))
        x = torch.cat([embed_norm, feature_norm], dim=-1)
    else:
        fc = predictor.fc  # QLinear quantizes its rows itself; split by input, each part with its own scale
        residual = x = (fc.forward_parts(embeds, features) if isinstance(fc, SplitInputLinear)
                        else fc(torch.cat([embeds, features], dim=-1)))
    form = input_form(predictor.qkv_proj, bias_ok=True)
    act = [x] if form == FLOAT else cpu_kernels.quantize(x, form)
    down, scale = attend_and_mlp(predictor, predictor.mlp, predictor.post_attention_layernorm, act, form, residual,
                                 positions, ctx, cache, predictor.rope, c.num_heads, c.num_kv_heads)
    return residual + (down if scale is None else down * scale)


def _one_call_weights(predictor: nn.Module) -> object | None:
    """`eagle_layer`'s weights for an EAGLE-1/2 predictor (None where a linear has no kernel form, or for EAGLE-3),
    cached on the predictor while its linears and norm stay the same objects (quantizing replaces them)."""
    # The module dicts directly: nn.Module attribute access costs microseconds, and this runs every forward.
    modules = predictor._modules
    fc, mlp = modules["fc"], modules["mlp"]._modules
    parts = tuple(fc._modules["parts"]) if isinstance(fc, SplitInputLinear) else ()
    norm = modules["post_attention_layernorm"]._parameters["weight"]
    linears = (modules["qkv_proj"], modules["o_proj"], mlp["gate_up_proj"], mlp["down_proj"], *parts)
    objects = (fc, *linears, norm)
    cached = predictor.__dict__.get("_one_call_weights")
    if cached is not None and len(cached[0]) == len(objects) and all(map(operator.is_, cached[0], objects)):
        return cached[1]
    weights = None
    entries = [linear_params(m) for m in linears]
    if predictor.config.version != 3 and len(parts) == 2 and all(e is not None for e in entries):
        kinds = [kind for kind, _ in entries] + [0, 0]  # the fc entry's last two linear slots stay empty
        params: list[Tensor | None] = [None, norm]
        for _, tensors in entries[:4]:
            params += tensors
        params += [None, None]
        for _, tensors in entries[4:]:
            params += tensors
        params += [None] * 8
        weights = cpu_kernels.layer_weights(params, kinds)
    object.__setattr__(predictor, "_one_call_weights", (objects, weights))
    return weights
