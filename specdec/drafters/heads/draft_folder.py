"""Draft-model folders that carry only decoder layers: the shipped distilled drafts and `specdec train draft`'s
output.

Such a folder holds `config.json` (the draft's llama config: the target's shape with fewer layers),
`model.safetensors` (decoder layers + final norm, Hugging Face names, bf16) and `specdec_draft.json` (which
target it was distilled from, and how). It has no embedding, LM head or tokenizer: the draft was trained
through the target's own embedding and tied LM head, so it is only meaningful on top of that target, and
reusing them costs no memory (the embedding is 28M of SmolLM2's 135M parameters; the layers of a two-layer
draft are 7M, 14 MB in bf16).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec.errors import ConfigError, ModelLoadError
from specdec.models.config import ModelConfig
from specdec.models.llama import LlamaModel

ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets" / "drafts"
WEIGHTS_FILE = "model.safetensors"
META_FILE = "specdec_draft.json"
_SHAPE_FIELDS = ("hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim")
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def shipped_draft_dir(target_name: str) -> Path | None:
    """The packaged draft folder for a target, or None when specdec ships none for it.

    `target_name` is an alias (`smollm2-135m`) or the folder a target was loaded from: the converted folder
    of an alias records the alias in its `specdec_source.json`, so `LoadedModel.source` works too.
    """
    alias = alias_of(target_name)
    if alias is None:
        return None
    folder = ASSETS_DIR / alias
    return folder if (folder / "config.json").is_file() and (folder / WEIGHTS_FILE).is_file() else None


def alias_of(target_name: str) -> str | None:
    from specdec.models import registry

    if registry.is_alias(target_name):
        return target_name
    source = Path(target_name).expanduser() / "specdec_source.json"
    try:
        info = json.loads(source.read_text())
    except (OSError, ValueError):
        return None
    if info.get("alias") in registry.ALIASES:
        return info["alias"]
    by_digest = {a.sha256: name for name, a in registry.ALIASES.items()}
    return by_digest.get(info.get("sha256"))


def is_draft_folder(ref: str | Path) -> bool:
    """Whether `ref` is a layers-only draft folder (as opposed to a whole model that a loader can read)."""
    folder = Path(ref).expanduser()
    if not folder.is_dir() or not (folder / "config.json").is_file():
        return False
    if (folder / META_FILE).is_file():
        return True
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        return False
    try:
        with safe_open(str(weights), framework="pt") as handle:
            keys = set(handle.keys())
    except Exception:
        return False
    return not any(k.endswith("embed_tokens.weight") for k in keys)


def load_draft_folder(folder: Path, target_loaded: Any) -> LlamaModel:
    """Build a layers-only draft on top of the target: its embedding and LM head are the target's modules
    (shared, not copied; an int8-quantized target head is shared as it is), its layers come from the folder,
    on the target's device and dtype."""
    folder = Path(folder).expanduser()
    target: LlamaModel = target_loaded.model
    config = _draft_config(folder, target.config)
    hf = _read_weights(folder, config)
    weights = {"norm.weight": hf["model.norm.weight"], "embed_tokens.weight": target.embed_tokens.weight}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        e = f"layers.{i}."
        weights[e + "self_attn.qkv_proj.weight"] = torch.cat([hf[f"{p}self_attn.{n}_proj.weight"] for n in "qkv"])
        if config.qkv_bias:
            weights[e + "self_attn.qkv_proj.bias"] = torch.cat([hf[f"{p}self_attn.{n}_proj.bias"] for n in "qkv"])
        weights[e + "self_attn.o_proj.weight"] = hf[f"{p}self_attn.o_proj.weight"]
        weights[e + "mlp.gate_up_proj.weight"] = torch.cat([hf[f"{p}mlp.gate_proj.weight"], hf[f"{p}mlp.up_proj.weight"]])
        weights[e + "mlp.down_proj.weight"] = hf[f"{p}mlp.down_proj.weight"]
        weights[e + "input_layernorm.weight"] = hf[f"{p}input_layernorm.weight"]
        weights[e + "post_attention_layernorm.weight"] = hf[f"{p}post_attention_layernorm.weight"]
    from specdec.models.loader import build_model

    draft = build_model(config, weights, target.dtype, target.device)
    share_target_head(draft, target)
    return draft


def share_target_head(draft: LlamaModel, target: LlamaModel) -> None:
    """Make the draft read tokens and write logits through the target's own modules."""
    draft.embed_tokens = target.embed_tokens
    draft.lm_head = target.lm_head


def _draft_config(folder: Path, target: ModelConfig) -> ModelConfig:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder} is not a draft folder: it has no config.json")
    config = ModelConfig.from_file(path)
    for name in _SHAPE_FIELDS:
        mine, theirs = getattr(config, name), getattr(target, name)
        if mine != theirs:
            raise ConfigError(f"draft config {path}: {name} is {mine}, but the target's is {theirs}; "
                              "this draft was made for another target")
    if config.num_layers < 1:
        raise ModelLoadError(f"draft config {path}: num_hidden_layers must be at least 1")
    # The rows of the target's embedding are the draft's; the draft never owns an LM head.
    return replace(config, tie_embeddings=True)


def _read_weights(folder: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        raise ModelLoadError(f"draft folder {folder} has no {WEIGHTS_FILE}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            hf = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as exc:
        raise ModelLoadError(f"cannot read draft weights {path}: {exc}") from None
    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(hf))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelLoadError(f"draft weights {path} lack {', '.join(missing[:3])}{more} "
                             f"(config.json says {config.num_layers} layers)")
    for key, shape in expected.items():
        if tuple(hf[key].shape) != shape:
            raise ModelLoadError(f"draft weights {path}: {key} has shape {tuple(hf[key].shape)}, "
                                 f"config.json implies {shape}")
    return hf


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape of every tensor a layers-only folder must hold."""
    h, inter = config.hidden_size, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.norm.weight": (h,)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        for name, out in (("q", config.q_size), ("k", config.kv_size), ("v", config.kv_size)):
            shapes[f"{p}self_attn.{name}_proj.weight"] = (out, h)
            if config.qkv_bias:
                shapes[f"{p}self_attn.{name}_proj.bias"] = (out,)
        shapes[f"{p}self_attn.o_proj.weight"] = (h, config.q_size)
        shapes[f"{p}mlp.gate_proj.weight"] = (inter, h)
        shapes[f"{p}mlp.up_proj.weight"] = (inter, h)
        shapes[f"{p}mlp.down_proj.weight"] = (h, inter)
        shapes[f"{p}input_layernorm.weight"] = (h,)
        shapes[f"{p}post_attention_layernorm.weight"] = (h,)
    return shapes


def write_draft_folder(draft: LlamaModel, folder: Path, meta: dict[str, Any],
                       dtype: torch.dtype = torch.bfloat16) -> None:
    """Write the draft's layers and final norm (Hugging Face names, unfused) + config + metadata."""
    c = draft.config
    tensors: dict[str, torch.Tensor] = {"model.norm.weight": draft.norm.weight}
    for i, layer in enumerate(draft.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.self_attn.qkv_proj.weight.split([c.q_size, c.kv_size, c.kv_size])
        tensors.update({f"{p}self_attn.q_proj.weight": q, f"{p}self_attn.k_proj.weight": k,
                        f"{p}self_attn.v_proj.weight": v})
        if c.qkv_bias:
            qb, kb, vb = layer.self_attn.qkv_proj.bias.split([c.q_size, c.kv_size, c.kv_size])
            tensors.update({f"{p}self_attn.q_proj.bias": qb, f"{p}self_attn.k_proj.bias": kb,
                            f"{p}self_attn.v_proj.bias": vb})
        gate, up = layer.mlp.gate_up_proj.weight.chunk(2)
        tensors.update({
            f"{p}self_attn.o_proj.weight": layer.self_attn.o_proj.weight,
            f"{p}mlp.gate_proj.weight": gate, f"{p}mlp.up_proj.weight": up,
            f"{p}mlp.down_proj.weight": layer.mlp.down_proj.weight,
            f"{p}input_layernorm.weight": layer.input_layernorm.weight,
            f"{p}post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
        })
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: t.detach().to("cpu", dtype).contiguous() for k, t in tensors.items()}
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config(c, dtype), indent=2) + "\n")
    (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def hf_config(config: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """A Hugging Face `config.json` for a model of `config`'s shape (what `ModelConfig.from_dict` reads)."""
    raw: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[config.architecture]],
        "model_type": config.architecture,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position,
        "rms_norm_eps": config.rms_eps,
        "rope_theta": config.rope_theta,
        "attention_bias": config.qkv_bias,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "dtype": str(dtype).removeprefix("torch."),
    }
    if config.rope_scaling:
        raw["rope_scaling"] = dict(config.rope_scaling)
    if config.bos_token_id is not None:
        raw["bos_token_id"] = config.bos_token_id
    if config.eos_token_ids:
        eos = list(config.eos_token_ids)
        raw["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    return raw
