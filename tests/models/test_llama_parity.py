"""Our llama-family model must give transformers' logits, for every architecture we claim to support."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

from specdec.errors import UnsupportedModelError
from specdec.kvcache import BlockTable, PagedKVCache
from specdec.models.config import ModelConfig
from specdec.models.context import AttentionContext
from specdec.models.loader import build_model, load_state_dict, to_engine_weights

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)
ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "llama3-rope-scaling": (LlamaConfig, LlamaForCausalLM, {"rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}}),
    "qwen2-bias-tied": (Qwen2Config, Qwen2ForCausalLM, {"tie_word_embeddings": True}),
    "mistral": (MistralConfig, MistralForCausalLM, {}),
}


def our_logits(model, ids: list[int], chunks: list[int]) -> torch.Tensor:
    """Run `ids` through our model in the given prefill chunk sizes, through a paged cache with small blocks."""
    c = model.config
    cache = PagedKVCache(c.num_layers, 64, 4, c.num_kv_heads, c.head_dim)
    table, out, start = BlockTable(), [], 0
    for n in chunks:
        prefix = table.length
        slots = cache.append(table, n)
        ctx = AttentionContext.build([table.blocks], [prefix], [n], slots, torch.device("cpu"))
        out.append(model(torch.tensor(ids[start:start + n]), torch.arange(prefix, prefix + n), ctx, cache.layers).logits)
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_logits_equal_transformers_on_tiny_random_models(name, tmp_path: Path):
    config_cls, model_cls, extra = ARCHITECTURES[name]
    torch.manual_seed(0)
    hf = model_cls(config_cls(**TINY, **extra)).eval()
    hf.save_pretrained(tmp_path)
    config = ModelConfig.from_file(tmp_path / "config.json")
    ours = build_model(config, to_engine_weights(load_state_dict(tmp_path), config), torch.float32,
                       torch.device("cpu"))
    ids = torch.randint(0, TINY["vocab_size"], (90,)).tolist()
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0]
    got = our_logits(ours, ids, [37, 1, 52])  # chunked prefill, a one-token step, then the rest
    assert (got - expected).abs().max().item() < 1e-4


def test_logits_equal_transformers_on_the_default_model(default_model, hf_default_model):
    tok = default_model.tokenizer
    ids = tok.encode("The quick brown fox jumps over the lazy dog because", add_special_tokens=False)
    with torch.no_grad():
        expected = hf_default_model(torch.tensor([ids])).logits[0]
    got = our_logits(default_model.model, ids, [len(ids)])
    assert (got - expected).abs().max().item() < 1e-3


def test_unsupported_architecture_names_what_is_supported():
    with pytest.raises(UnsupportedModelError, match=r"not supported: GPT2LMHeadModel; supported: .*LlamaForCausalLM"):
        ModelConfig.from_dict({"architectures": ["GPT2LMHeadModel"]})


def test_unsupported_rope_scaling_is_refused():
    raw = {"architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
           "num_hidden_layers": 1, "num_attention_heads": 2, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    with pytest.raises(UnsupportedModelError, match="yarn"):
        ModelConfig.from_dict(raw)
