"""Turn a target name into a ready model and tokenizer.

A target is one of: a default-model alias (`smollm2-135m`), a Hugging Face folder, a `.gguf` file, a hub id
(only when the hub is reachable), or `dummy:<shape>`. Everything becomes a Hugging Face folder first (GGUF
files are converted once into the cache), and one safetensors loader reads every folder.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from specdec.config import WEIGHT_BITS
from specdec.errors import ConfigError, ModelLoadError, OfflineError
from specdec.models.config import ModelConfig
from specdec.models.dummy import dummy_config
from specdec.models.llama import LlamaModel
from specdec.models.tokenizer import ByteTokenizer, load_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: LlamaModel
    tokenizer: Any  # FastTokenizer (or transformers' for folders it cannot reproduce), ByteTokenizer for dummies
    source: str  # where the weights came from (a folder, or "dummy:<shape>")
    quantized: str | None = None  # "int8" once the model's linears were swapped for int8 ones


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype '{name}'; choose one of: {', '.join(DTYPES)}")
    return DTYPES[name]


def parse_device(name: str | torch.device) -> torch.device:
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"unknown device '{name}'; use cpu or cuda[:N]") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for, but no CUDA GPU is available here; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device '{name}' is not supported; use cpu or cuda[:N]")
    return device


def resolve_target(target: str, show_progress: bool = True) -> Path:
    """The local Hugging Face folder holding `target`, fetching or converting it first if needed."""
    from specdec.models import registry

    if registry.is_alias(target):
        return registry.resolve_alias(target, show_progress=show_progress)
    path = Path(target).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        from specdec.models.gguf_convert import convert_gguf, gguf_cache_dir

        folder = gguf_cache_dir(path)
        if not (folder / "config.json").is_file():
            convert_gguf(path, folder, show_progress=show_progress, expected_sha256=registry.pinned_sha256(path))
        return folder
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a model folder: it has no config.json")
        return path
    if path.exists():
        raise ModelLoadError(f"{path} is neither a model folder nor a .gguf file")
    if target.count("/") == 1 and not target.startswith((".", "/", "~")):
        return _download_from_hub(target)
    raise ModelLoadError(
        f"model not found: '{target}'. Give a default-model alias ({', '.join(registry.ALIASES)}), "
        "a Hugging Face folder, a .gguf file, a hub id (owner/name, online only) or dummy:<shape>"
    )


def _download_from_hub(repo_id: str) -> Path:
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        raise OfflineError(f"'{repo_id}' looks like a hub id, but HF_HUB_OFFLINE is set; give a local folder")
    try:
        from huggingface_hub import snapshot_download

        folder = snapshot_download(
            repo_id,
            allow_patterns=["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                            "tokenizer*", "special_tokens_map.json", "*.jinja"],
        )
    except Exception as exc:  # the hub client raises many kinds; all mean "could not fetch"
        raise OfflineError(
            f"cannot fetch '{repo_id}' from the Hugging Face hub ({type(exc).__name__}). "
            "If this machine is offline, download the model elsewhere and pass its folder instead"
        ) from None
    return Path(folder)


def weight_files(folder: Path) -> list[str]:
    """The safetensors file names of a folder (single file or sharded with an index)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} holds no .safetensors weights")
    return files


def load_state_dict(folder: Path, keep: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a folder's safetensors files (all of them, or those whose name `keep` accepts)."""
    tensors: dict[str, torch.Tensor] = {}
    for name in weight_files(folder):
        try:
            with safe_open(str(folder / name), framework="pt") as handle:
                for key in handle.keys():
                    if keep is None or keep(key):
                        tensors[key] = handle.get_tensor(key)
        except Exception as exc:
            raise ModelLoadError(f"cannot read weights {folder / name}: {exc}") from None
    return tensors


def to_engine_weights(hf: dict[str, torch.Tensor], config: ModelConfig, layers: Iterable[int] | None = None,
                      top: bool = True) -> dict[str, torch.Tensor]:
    """Rename transformers' parameter names to ours, fusing q/k/v and gate/up projections. `layers` (default
    all) and `top` (embedding, final norm, LM head) pick a part of the model, for loading it piece by piece."""
    def take(key: str) -> torch.Tensor:
        full = key if key in hf else f"model.{key}"
        if full not in hf:
            raise ModelLoadError(f"checkpoint lacks the tensor '{full}'")
        return hf[full]

    out = {}
    if top:
        out.update({"embed_tokens.weight": take("embed_tokens.weight"), "norm.weight": take("norm.weight")})
        if not config.tie_embeddings:
            out["lm_head.weight"] = hf.get("lm_head.weight", out["embed_tokens.weight"])
    for i in range(config.num_layers) if layers is None else layers:
        p = f"layers.{i}."
        attn = p + "self_attn."
        out[attn + "qkv_proj.weight"] = torch.cat([take(f"{attn}{n}_proj.weight") for n in "qkv"])
        if config.qkv_bias:
            out[attn + "qkv_proj.bias"] = torch.cat([take(f"{attn}{n}_proj.bias") for n in "qkv"])
        out[attn + "o_proj.weight"] = take(attn + "o_proj.weight")
        out[p + "mlp.gate_up_proj.weight"] = torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])
        out[p + "mlp.down_proj.weight"] = take(p + "mlp.down_proj.weight")
        out[p + "input_layernorm.weight"] = take(p + "input_layernorm.weight")
        out[p + "post_attention_layernorm.weight"] = take(p + "post_attention_layernorm.weight")
    return out


def build_model(config: ModelConfig, weights: dict[str, torch.Tensor] | None, dtype: torch.dtype,
                device: torch.device, seed: int = 0) -> LlamaModel:
    """Our model from engine-named weights, or with random weights when `weights` is None."""
    # Built on the CPU with uninitialised storage (torch.empty touches no pages, so this costs no memory
    # traffic) rather than on the meta device: meta tensors send every factory call of the constructor
    # (RoPE's arange, the embedding's normal_) through torch's Python meta kernels, whose first use imports
    # ~900 modules of torch._dynamo and torch._refs: 3-7 s of every start-up (issue 18).
    with _no_weight_init():
        model = LlamaModel(config, device="cpu")
    if weights is None:
        weights = _random_weights(model, dtype, device, seed)
    weights = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
    missing = set(model.state_dict()) - set(weights) - ({"lm_head.weight"} if config.tie_embeddings else set())
    if missing:
        raise ModelLoadError(f"checkpoint lacks tensors: {', '.join(sorted(missing)[:5])}")
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    for name, tensor in weights.items():
        expected = shapes.get(name)
        if expected is not None and tuple(tensor.shape) != expected:
            raise ModelLoadError(f"tensor {name} has shape {tuple(tensor.shape)}, the config implies {expected}")
    model.load_state_dict(weights, strict=False, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rope = type(model.rope)(config, device)
    return model.eval().requires_grad_(False)


@contextlib.contextmanager
def _no_weight_init() -> Iterator[None]:
    """Module constructors initialise weights that `build_model` replaces at once: skip that work (135M
    random numbers for the default model) by making torch's initialisers no-ops while the model is built."""
    from torch.nn import init

    names = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
             "trunc_normal_", "zeros_", "ones_", "constant_")
    saved = {name: getattr(init, name) for name in names if hasattr(init, name)}
    for name in saved:
        setattr(init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(init, name, fn)


def _random_weights(model: LlamaModel, dtype: torch.dtype, device: torch.device, seed: int) -> dict:
    generator = torch.Generator(device=device).manual_seed(seed)
    weights = {}
    for name, param in model.state_dict().items():
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(param.shape, dtype=dtype, device=device)
        else:
            weights[name] = (torch.randn(param.shape, generator=generator, device=device) * 0.02).to(dtype)
    return weights


def load_model(target: str, device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
               show_progress: bool = True, quantize: str | None = None) -> LoadedModel:
    """Load any supported target onto a device, in a dtype.

    `quantize` ("int8", "int7" or "int4", CPU float32) quantizes the model as it loads, one decoder layer at a time
    (specdec/models/quantized_load.py), so the float weights of the whole model are never in memory at once;
    the result is the same model `quantize_model_int8_` makes of a float one."""
    torch_dtype, torch_device = parse_dtype(dtype), parse_device(device)
    if target.startswith("dummy:"):
        config = dummy_config(target.split(":", 1)[1])
        model = build_model(config, None, torch_dtype, torch_device)
        return LoadedModel(model, ByteTokenizer(config.vocab_size, config.eos_token_ids), target)
    folder = resolve_target(target, show_progress=show_progress)
    config = ModelConfig.from_file(folder / "config.json")
    if quantize in WEIGHT_BITS and torch_device.type == "cpu" and torch_dtype == torch.float32:
        from specdec.models.quantized_load import load_quantized

        model = load_quantized(folder, config, bits=WEIGHT_BITS[quantize])
        return LoadedModel(model, load_tokenizer(folder), str(folder), quantized=quantize)
    weights = to_engine_weights(load_state_dict(folder), config)
    model = build_model(config, weights, torch_dtype, torch_device)
    return LoadedModel(model, load_tokenizer(folder), str(folder))
