"""Load a model straight into its int8 (or int4) serving form, one decoder layer at a time.

Loading a float model and then quantizing it holds the float32 weights of the whole model first: 6 GB for
Qwen2.5-Coder-1.5B (plus the fused q/k/v and gate/up copies), where its int8 form is about 2.5 GB. Here the
model is built with unallocated weights (torch.empty touches no memory), then each layer's tensors are read
from the safetensors file(s) (bf16 or fp32 on disk), made float32, loaded into that layer and quantized by the
same policy as `quantize_model_int8_` before the next layer is read. The float32 copy of one layer is the
only float weight in memory beyond the embedding, final norm and the LM head (which is quantized last).
The result is the model `quantize_model_int8_` makes from a float load of the same folder, module for module
and bit for bit (tests/models/test_quantized_load.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.errors import ModelLoadError
from specdec.models.config import ModelConfig
from specdec.models.llama import LlamaModel
from specdec.models.loader import _no_weight_init, load_state_dict, to_engine_weights
from specdec.models.quant import finish_int8_serving, head_bits, int8_serving_policy, quantize_int8_


def load_quantized(folder: Path, config: ModelConfig, bits: int = 8, layers_only: bool = False) -> LlamaModel:
    """The int8 (bits=8), int7 (bits=7) or int4 (bits=4) CPU serving model of the HF folder `folder`.

    `layers_only`: the decoder layers only; the embedding, final norm and head stay unset (never read, so never
    in memory) for a caller that gives the model others' (an int4 draft's int8 twin borrows the draft's)."""
    with _no_weight_init():
        model = LlamaModel(config, device="cpu")
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    unset = set(shapes) - ({"lm_head.weight"} if config.tie_embeddings else set())
    top = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "embed_tokens.weight", "norm.weight"}
    if layers_only:
        unset -= {"embed_tokens.weight", "norm.weight", "lm_head.weight"}
        top = set()
    hf = load_state_dict(folder, lambda k: k in top)
    stored_head = hf.pop("lm_head.weight", None)  # kept in its stored dtype: quantized in slices, never float32
    engine = to_engine_weights(hf, config, layers=(), top=True) if not layers_only else {}
    fallback_head = engine.pop("lm_head.weight", None)  # untied checkpoints without one reuse the embedding
    del hf
    _assign(model, engine, shapes, unset)
    del engine
    unset.discard("lm_head.weight")
    make = int8_serving_policy(model, bits)
    for i, layer in enumerate(model.layers):
        prefixes = (f"model.layers.{i}.", f"layers.{i}.")
        hf = load_state_dict(folder, lambda k: k.startswith(prefixes))
        _assign(model, to_engine_weights(hf, config, layers=(i,), top=False), shapes, unset)
        del hf
        quantize_int8_(layer, make=make)
    if unset:
        raise ModelLoadError(f"checkpoint lacks tensors: {', '.join(sorted(unset)[:5])}")
    if not layers_only:
        head = model.embed_tokens.weight if config.tie_embeddings else (
            stored_head if stored_head is not None else fallback_head)
        if tuple(head.shape) != shapes["lm_head.weight"]:
            raise ModelLoadError(f"tensor lm_head.weight has shape {tuple(head.shape)}, the config implies "
                                 f"{shapes['lm_head.weight']}")
        _quantize_head(model, head, make, head_bits(bits))
    del stored_head, fallback_head
    model.rope = type(model.rope)(config, "cpu")
    finish_int8_serving(model)
    return model.eval().requires_grad_(False)


def _assign(model: LlamaModel, weights: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]],
            unset: set[str]) -> None:
    """Put float32 copies of `weights` (engine names) into `model`, checking every shape first; the names are
    struck off `unset`."""
    for name, tensor in weights.items():
        if name not in shapes:
            raise ModelLoadError(f"checkpoint holds an unexpected tensor {name}")
        if tuple(tensor.shape) != shapes[name]:
            raise ModelLoadError(f"tensor {name} has shape {tuple(tensor.shape)}, the config implies {shapes[name]}")
    model.load_state_dict({k: v.to(torch.float32) for k, v in weights.items()}, strict=False, assign=True)
    unset.difference_update(weights)


_HEAD_SLICE = 8192  # rows of the LM head quantized at a time (151,936 rows for Qwen)


def _quantize_head(model: LlamaModel, weight: torch.Tensor, make, bits: int) -> None:
    """Replace the LM head by its `bits`-bit QLinear (8 or 7), quantized from `weight` (any float dtype) a slice of
    rows at a time: the same bits as `QLinear.from_linear` (the scale is per row), without a float32 copy of a
    151,936-row matrix and its temporaries (about 2 GB for the 0.5B draft's head). Where the policy gives
    the head another kind of layer, it gets it through `quantize_int8_` as usual."""
    from torch import nn

    from specdec.kernels.reference import pack_q8
    from specdec.models.qlinear import QLinear
    from specdec.models.quant import quantize_weight_per_channel

    out_features, in_features = weight.shape
    if make is None or not QLinear.supports(in_features):
        model.lm_head.weight = nn.Parameter(weight.to(torch.float32), requires_grad=False)
        quantize_int8_(model, make=make)
        return
    q = torch.empty(out_features, in_features, dtype=torch.int8)
    scale = torch.empty(out_features, dtype=torch.float32)
    for start in range(0, out_features, _HEAD_SLICE):
        rows = slice(start, start + _HEAD_SLICE)
        q[rows], scale[rows] = quantize_weight_per_channel(weight[rows], bits)
    model.lm_head = QLinear(in_features, out_features, bits, pack_q8(q), (scale,), None)
