"""`dummy:<shape>` targets: random weights of real model shapes.

No weights can travel to a GPU machine, so systems benchmarks there run on random weights with the exact
shapes (and therefore the exact cost) of the real models. The tiny shapes serve tests.
"""

from __future__ import annotations

from typing import Any

from specdec.errors import ConfigError
from specdec.models.config import ModelConfig


def _shape(arch: str, vocab: int, hidden: int, inter: int, layers: int, heads: int, kv: int, **extra: Any) -> dict:
    return {
        "architectures": [arch],
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **extra,
    }


DUMMY_SHAPES: dict[str, dict] = {
    "llama-3-8b": _shape(
        "LlamaForCausalLM", 128256, 4096, 14336, 32, 32, 8, rope_theta=500000.0, max_position_embeddings=8192
    ),
    "llama-3.1-8b": _shape(
        "LlamaForCausalLM", 128256, 4096, 14336, 32, 32, 8, rope_theta=500000.0, max_position_embeddings=131072,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
    ),
    "llama-2-7b": _shape("LlamaForCausalLM", 32000, 4096, 11008, 32, 32, 32, max_position_embeddings=4096),
    "mistral-7b": _shape(
        "MistralForCausalLM", 32000, 4096, 14336, 32, 32, 8, max_position_embeddings=32768, rope_theta=1e6
    ),
    "qwen2.5-7b": _shape(
        "Qwen2ForCausalLM", 152064, 3584, 18944, 28, 28, 4, rope_theta=1e6, max_position_embeddings=32768,
        attention_bias=True,
    ),
    "smollm2-135m": _shape(
        "LlamaForCausalLM", 49152, 576, 1536, 30, 9, 3, rope_theta=100000.0, max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    "tiny-llama": _shape("LlamaForCausalLM", 512, 64, 128, 2, 4, 2, max_position_embeddings=1024),
    "tiny-qwen2": _shape(
        "Qwen2ForCausalLM", 512, 64, 128, 2, 4, 1, max_position_embeddings=1024, attention_bias=True,
        tie_word_embeddings=True,
    ),
}


def dummy_config(name: str) -> ModelConfig:
    if name not in DUMMY_SHAPES:
        raise ConfigError(f"unknown dummy shape '{name}'; known: {', '.join(DUMMY_SHAPES)}")
    return ModelConfig.from_dict(DUMMY_SHAPES[name])
