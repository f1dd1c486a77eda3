"""EAGLE checkpoints: the published layouts, read and written, and our own folder format.

Published EAGLE-1/2 (SafeAILab/EAGLE): `config.json` (a llama/qwen2 config with one layer) and
`model.safetensors` or `pytorch_model.bin` holding `fc.weight [H, 2H]` (+ `fc.bias`), `layers.0.self_attn.
{q,k,v,o}_proj.weight` (+ q/k/v biases for Qwen2), `layers.0.mlp.{gate,up,down}_proj.weight` and
`layers.0.post_attention_layernorm.weight`. Published EAGLE-3: `fc.weight [H, 3H]`, `midlayer.*` (the same
layer with `input_layernorm`, `hidden_norm`, and q/k/v reading 2H), `norm.weight`, `lm_head.weight [Vd, H]`,
`d2t [Vd]` (target id = j + d2t[j]) and `t2d [V]` (which target ids the draft vocabulary holds). Embeddings
(and for EAGLE-1/2 the LM head) are the target's; extra keys such as `embed_tokens.weight` are ignored.

Our format is the same tensors in bf16 `model.safetensors`, plus `specdec_eagle.json` (version, the target
layers EAGLE-3 reads, and how the weights were made). Loading accepts both.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from specdec.drafters.heads.eagle_model import EagleConfig, EaglePredictor
from specdec.errors import ConfigError, ModelLoadError
from specdec.models.config import ModelConfig

META_FILE = "specdec_eagle.json"
SAFETENSORS = "model.safetensors"
TORCH_BIN = "pytorch_model.bin"


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high target layers: the residual streams entering 2, N//2 and N-3 (clamped
    into the model for toy targets of fewer than six layers)."""
    return tuple(min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3))  # type: ignore


def read_tensors(folder: Path) -> dict[str, Tensor]:
    """All tensors of a checkpoint folder, `model.` prefixes stripped."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ModelLoadError(f"EAGLE checkpoint folder not found: {folder}")
    st, pt = folder / SAFETENSORS, folder / TORCH_BIN
    try:
        if st.is_file():
            from safetensors.torch import load_file

            raw = load_file(str(st))
        elif pt.is_file():
            raw = torch.load(pt, map_location="cpu", weights_only=True)
        else:
            raise ModelLoadError(f"EAGLE checkpoint {folder} has neither {SAFETENSORS} nor {TORCH_BIN}")
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"cannot read EAGLE weights in {folder}: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"EAGLE weights in {folder} are not a dict of tensors")
    return {k.removeprefix("model."): v for k, v in raw.items() if isinstance(v, Tensor)}


def checkpoint_version(tensors: dict[str, Tensor]) -> int:
    if any(k.startswith("midlayer.") for k in tensors):
        return 3
    if any(k.startswith("layers.0.") for k in tensors):
        return 1
    raise ModelLoadError("not an EAGLE checkpoint: found neither layers.0.* (EAGLE-1/2) nor midlayer.* (EAGLE-3) "
                         f"among its keys ({', '.join(sorted(tensors)[:4])}, ...)")


def eagle_config(raw: dict[str, Any], tensors: dict[str, Tensor], target: ModelConfig) -> EagleConfig:
    """The predictor's shape from its `config.json` and weights, checked against the target."""
    version = checkpoint_version(tensors)
    kind = " ".join([str(raw.get("model_type", ""))] + [str(a) for a in raw.get("architectures") or []]).lower()
    arch = "Qwen2ForCausalLM" if "qwen2" in kind else "LlamaForCausalLM"
    prefix = "midlayer." if version == 3 else "layers.0."
    merged = {"vocab_size": target.vocab_size, "max_position_embeddings": target.max_position,
              **raw, "architectures": [arch], "num_hidden_layers": 1,
              "attention_bias": f"{prefix}self_attn.q_proj.bias" in tensors}
    try:
        layer = ModelConfig.from_dict(merged)
    except ModelLoadError as exc:
        raise ModelLoadError(f"EAGLE config.json: {exc}") from None
    for name in ("hidden_size", "vocab_size"):
        if getattr(layer, name) != getattr(target, name):
            raise ConfigError(f"EAGLE checkpoint: {name} is {getattr(layer, name)}, but the target's is "
                              f"{getattr(target, name)}; this checkpoint was made for another target")
    layer = replace(layer, max_position=target.max_position)
    draft_vocab = 0
    if version == 3:
        head = tensors.get("lm_head.weight")
        draft_vocab = int(raw.get("draft_vocab_size") or (head.shape[0] if head is not None else 0))
        if draft_vocab < 1:
            raise ModelLoadError("EAGLE-3 checkpoint lacks lm_head.weight (and config.json has no draft_vocab_size)")
    return EagleConfig(layer=layer, version=version, fc_bias="fc.bias" in tensors, draft_vocab=draft_vocab,
                       num_features=3 if version == 3 else 1)


def expected_shapes(config: EagleConfig) -> dict[str, tuple[int, ...]]:
    """Published name -> shape, for every tensor a checkpoint of this shape must hold."""
    c, h = config.layer, config.hidden_size
    v3 = config.version == 3
    p = "midlayer." if v3 else "layers.0."
    attn_in = 2 * h if v3 else h
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (h, config.fc_in)}
    if config.fc_bias:
        shapes["fc.bias"] = (h,)
    for name, out in (("q", c.q_size), ("k", c.kv_size), ("v", c.kv_size)):
        shapes[f"{p}self_attn.{name}_proj.weight"] = (out, attn_in)
        if c.qkv_bias:
            shapes[f"{p}self_attn.{name}_proj.bias"] = (out,)
    shapes[f"{p}self_attn.o_proj.weight"] = (h, c.q_size)
    shapes[f"{p}mlp.gate_proj.weight"] = (c.intermediate_size, h)
    shapes[f"{p}mlp.up_proj.weight"] = (c.intermediate_size, h)
    shapes[f"{p}mlp.down_proj.weight"] = (h, c.intermediate_size)
    shapes[f"{p}post_attention_layernorm.weight"] = (h,)
    if v3:
        shapes.update({f"{p}input_layernorm.weight": (h,), f"{p}hidden_norm.weight": (h,), "norm.weight": (h,),
                       "lm_head.weight": (config.draft_vocab, h), "d2t": (config.draft_vocab,),
                       "t2d": (c.vocab_size,)})
    return shapes


def check_tensors(tensors: dict[str, Tensor], config: EagleConfig, where: str) -> None:
    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelLoadError(f"EAGLE checkpoint {where} lacks {', '.join(missing[:3])}{more}")
    for key, shape in expected.items():
        if tuple(tensors[key].shape) != shape:
            raise ModelLoadError(f"EAGLE checkpoint {where}: {key} has shape {tuple(tensors[key].shape)}, but "
                                 f"config.json and the target imply {shape}")
    if config.version == 3:
        targets = torch.arange(config.draft_vocab) + tensors["d2t"].long()
        if int(targets.min()) < 0 or int(targets.max()) >= config.layer.vocab_size:
            raise ModelLoadError(f"EAGLE checkpoint {where}: d2t maps draft ids outside the target vocabulary")


def build_predictor(config: EagleConfig, tensors: dict[str, Tensor], device: torch.device,
                    dtype: torch.dtype) -> EaglePredictor:
    """A predictor from published-name tensors (shapes already checked)."""
    v3 = config.version == 3
    p = "midlayer." if v3 else "layers.0."
    ours = {
        "fc.weight": tensors["fc.weight"],
        "qkv_proj.weight": torch.cat([tensors[f"{p}self_attn.{n}_proj.weight"] for n in "qkv"]),
        "o_proj.weight": tensors[f"{p}self_attn.o_proj.weight"],
        "mlp.gate_up_proj.weight": torch.cat([tensors[f"{p}mlp.gate_proj.weight"], tensors[f"{p}mlp.up_proj.weight"]]),
        "mlp.down_proj.weight": tensors[f"{p}mlp.down_proj.weight"],
        "post_attention_layernorm.weight": tensors[f"{p}post_attention_layernorm.weight"],
    }
    if config.fc_bias:
        ours["fc.bias"] = tensors["fc.bias"]
    if config.layer.qkv_bias:
        ours["qkv_proj.bias"] = torch.cat([tensors[f"{p}self_attn.{n}_proj.bias"] for n in "qkv"])
    if v3:
        ours.update({"input_layernorm.weight": tensors[f"{p}input_layernorm.weight"],
                     "hidden_norm.weight": tensors[f"{p}hidden_norm.weight"],
                     "norm.weight": tensors["norm.weight"], "lm_head.weight": tensors["lm_head.weight"]})
    model = EaglePredictor(config, device)
    model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in ours.items()}, strict=True)
    model.to(device=device, dtype=dtype)
    model.rope = type(model.rope)(config.layer, device)
    if v3:
        model.draft_to_target = (torch.arange(config.draft_vocab) + tensors["d2t"].long()).to(device)
    return model.eval().requires_grad_(False)


def load_eagle(folder: Path, target: ModelConfig, device: torch.device,
               dtype: torch.dtype) -> tuple[EaglePredictor, dict[str, Any]]:
    """Load an EAGLE checkpoint folder (published layout or ours) for `target`; returns it and its metadata."""
    folder = Path(folder).expanduser()
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"EAGLE checkpoint {folder} has no config.json")
    try:
        raw = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {config_path}: {exc}") from None
    tensors = read_tensors(folder)
    config = eagle_config(raw, tensors, target)
    check_tensors(tensors, config, str(folder))
    meta: dict[str, Any] = {}
    if (folder / META_FILE).is_file():
        meta = json.loads((folder / META_FILE).read_text())
    return build_predictor(config, tensors, device, dtype), meta


def published_tensors(model: EaglePredictor) -> dict[str, Tensor]:
    """The predictor's weights under the published names (q/k/v and gate/up unfused)."""
    config, c = model.config, model.config.layer
    v3 = config.version == 3
    p = "midlayer." if v3 else "layers.0."
    q, k, v = model.qkv_proj.weight.split([c.q_size, c.kv_size, c.kv_size])
    gate, up = model.mlp.gate_up_proj.weight.chunk(2)
    out = {"fc.weight": model.fc.weight, f"{p}self_attn.q_proj.weight": q, f"{p}self_attn.k_proj.weight": k,
           f"{p}self_attn.v_proj.weight": v, f"{p}self_attn.o_proj.weight": model.o_proj.weight,
           f"{p}mlp.gate_proj.weight": gate, f"{p}mlp.up_proj.weight": up,
           f"{p}mlp.down_proj.weight": model.mlp.down_proj.weight,
           f"{p}post_attention_layernorm.weight": model.post_attention_layernorm.weight}
    if config.fc_bias:
        out["fc.bias"] = model.fc.bias
    if c.qkv_bias:
        for name, bias in zip("qkv", model.qkv_proj.bias.split([c.q_size, c.kv_size, c.kv_size])):
            out[f"{p}self_attn.{name}_proj.bias"] = bias
    if v3:
        out.update({f"{p}input_layernorm.weight": model.input_layernorm.weight,
                    f"{p}hidden_norm.weight": model.hidden_norm.weight, "norm.weight": model.norm.weight,
                    "lm_head.weight": model.lm_head.weight})
    return out


def write_eagle(model: EaglePredictor, folder: Path, meta: dict[str, Any], published: bool = False,
                dtype: torch.dtype = torch.bfloat16) -> None:
    """Write a checkpoint folder: ours (bf16 safetensors + metadata) or, with `published`, the layout the
    EAGLE reference code loads (`pytorch_model.bin` in fp16 and its config fields)."""
    config = model.config
    dtype = torch.float16 if published else dtype
    tensors = {k: t.detach().to("cpu", dtype).contiguous() for k, t in published_tensors(model).items()}
    if config.version == 3:
        ids = model.draft_to_target.cpu()
        tensors["d2t"] = ids - torch.arange(config.draft_vocab)
        t2d = torch.zeros(config.layer.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        tensors["t2d"] = t2d
    folder.mkdir(parents=True, exist_ok=True)
    if published:
        torch.save(tensors, folder / TORCH_BIN)
    else:
        from safetensors.torch import save_file

        save_file(tensors, str(folder / SAFETENSORS), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(_hf_config(config, dtype, published), indent=2) + "\n")
    if not published:
        (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def _hf_config(config: EagleConfig, dtype: torch.dtype, published: bool) -> dict[str, Any]:
    from specdec.drafters.heads.draft_folder import hf_config

    raw = hf_config(replace(config.layer, num_layers=1), dtype)
    raw.pop("tie_word_embeddings", None)
    raw["bias"] = config.fc_bias  # the EAGLE reference code's name for fc's bias
    if config.version == 3:
        raw["draft_vocab_size"] = config.draft_vocab
        if published:
            raw["architectures"] = ["LlamaForCausalLMEagle3"]
    return raw
