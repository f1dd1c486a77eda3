"""The model shape specdec needs, read from a Hugging Face `config.json` of the llama family.

Llama 2/3, Mistral, Qwen2/2.5 and SmolLM2 share one architecture up to a few switches (q/k/v bias, tied
embeddings, rope scaling), so one frozen dataclass describes them all and the rest of the engine never looks
at the raw config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.errors import ModelLoadError, UnsupportedModelError

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position: int
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    qkv_bias: bool = False
    tie_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # K/V cache (and attention) precision when it must differ from the weights', as a torch dtype name; set by
    # the serving policy (specdec.models.quant.quantize_model_int8_), never read from config.json. The runner
    # allocates the cache in it.
    kv_cache_dtype: str | None = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_parameters(self) -> int:
        """Parameter count, for bandwidth bounds and the `models` listing."""
        h, layers = self.hidden_size, self.num_layers
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        mlp = 3 * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_embeddings else 2)
        return layers * (attn + mlp + 2 * h) + embed + h

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        archs = raw.get("architectures") or []
        arch = archs[0] if archs else _arch_from_model_type(raw.get("model_type", ""))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"not supported: {arch or raw.get('model_type') or 'unknown architecture'}; "
                f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
            )
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            theta, scaling = _rope_settings(raw)
            eos = raw.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
            return cls(
                architecture=SUPPORTED_ARCHITECTURES[arch],
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                max_position=_context_limit(raw),
                rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling=scaling,
                qkv_bias=bool(raw.get("attention_bias", SUPPORTED_ARCHITECTURES[arch] == "qwen2")),
                tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=tuple(int(e) for e in eos_ids),
            )
        except KeyError as missing:
            raise ModelLoadError(f"config.json lacks the field {missing}") from None

    @classmethod
    def from_file(cls, path: Path) -> "ModelConfig":
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"cannot read model config {path}: {exc}") from None
        return cls.from_dict(raw)


def _arch_from_model_type(model_type: str) -> str:
    return {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}.get(
        model_type, model_type
    )


def _rope_settings(raw: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """rope theta and scaling, from either the transformers-4 fields or transformers-5 `rope_parameters`."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = dict(raw.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    scaling = {**scaling, **params}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"not supported: rope scaling '{rope_type}'; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, {}
    return theta, {**scaling, "rope_type": rope_type}


def _context_limit(raw: dict[str, Any]) -> int:
    """Longest context we serve exactly. Sliding-window attention is not implemented, so a model that
    uses one is served up to its window, where full attention and the window agree."""
    limit = int(raw.get("max_position_embeddings", 2048))
    window = raw.get("sliding_window")
    uses_window = raw.get("use_sliding_window", raw.get("model_type") == "mistral")
    if window and uses_window:
        limit = min(limit, int(window))
    return limit
