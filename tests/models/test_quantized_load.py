"""Loading straight into int8/int4, a layer at a time (specdec/models/quantized_load.py), gives the same model
as loading float32 and quantizing it afterwards: the same module types, the same bits in every buffer, the
same K/V policy. A qwen2-shaped folder (q/k/v bias, untied or tied head), stored bf16 as the Qwen aliases
are and fp32 as the default model is."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from specdec.errors import ModelLoadError
from specdec.models.config import ModelConfig
from specdec.models.loader import build_model, load_state_dict, to_engine_weights
from specdec.models.quant import quantize_model_int8_
from specdec.models.quantized_load import load_quantized

HIDDEN, HEADS, KV, FFN, LAYERS, VOCAB = 64, 4, 2, 96, 2, 100


def _folder(tmp_path, dtype: torch.dtype, tied: bool, drop: str | None = None):
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": VOCAB,
              "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "num_key_value_heads": KV, "max_position_embeddings": 128,
              "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": tied}
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(shape, generator=g) * 0.1).to(dtype)

    head_dim = HIDDEN // HEADS
    w = {"model.embed_tokens.weight": rand(VOCAB, HIDDEN), "model.norm.weight": rand(HIDDEN) + 1}
    if not tied:
        w["lm_head.weight"] = rand(VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for n, rows in (("q", HEADS * head_dim), ("k", KV * head_dim), ("v", KV * head_dim)):
            w[f"{p}self_attn.{n}_proj.weight"] = rand(rows, HIDDEN)
            w[f"{p}self_attn.{n}_proj.bias"] = rand(rows)
        w[p + "self_attn.o_proj.weight"] = rand(HIDDEN, HIDDEN)
        w[p + "mlp.gate_proj.weight"] = rand(FFN, HIDDEN)
        w[p + "mlp.up_proj.weight"] = rand(FFN, HIDDEN)
        w[p + "mlp.down_proj.weight"] = rand(HIDDEN, FFN)
        w[p + "input_layernorm.weight"] = rand(HIDDEN) + 1
        w[p + "post_attention_layernorm.weight"] = rand(HIDDEN) + 1
    if drop is not None:
        del w[drop]
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file(w, str(folder / "model.safetensors"))
    return folder, ModelConfig.from_file(folder / "config.json")


def _state(model) -> dict[str, torch.Tensor]:
    out = {f"p:{k}": v for k, v in model.named_parameters()}
    out.update({f"b:{k}": v for k, v in model.named_buffers() if v is not None})
    return out


@pytest.mark.parametrize("dtype,tied,bits", [(torch.bfloat16, False, 8), (torch.float32, True, 8),
                                             (torch.bfloat16, True, 4)])
def test_layer_by_layer_quantized_load_equals_quantizing_a_float_load(tmp_path, monkeypatch, dtype, tied, bits):
    from specdec.models import quantized_load

    monkeypatch.setattr(quantized_load, "_HEAD_SLICE", 7)  # the head in slices of 7 of its 100 rows
    folder, config = _folder(tmp_path, dtype, tied)
    streamed = load_quantized(folder, config, bits=bits)
    whole = build_model(config, to_engine_weights(load_state_dict(folder), config), torch.float32,
                        torch.device("cpu"))
    quantize_model_int8_(whole, bits=bits)
    assert [type(m).__name__ for m in streamed.modules()] == [type(m).__name__ for m in whole.modules()]
    a, b = _state(streamed), _state(whole)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
    assert streamed.config == whole.config
    assert streamed.embed_tokens.weight.dtype == torch.float32
    if tied:
        assert streamed.lm_head is not streamed.embed_tokens  # the head got its own int8 copy


def test_a_missing_layer_tensor_is_named(tmp_path):
    folder, config = _folder(tmp_path, torch.bfloat16, False, drop="model.layers.1.self_attn.v_proj.bias")
    with pytest.raises(ModelLoadError, match="model.layers.1.self_attn.v_proj.bias"):
        load_quantized(folder, config)
