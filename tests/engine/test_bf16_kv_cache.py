"""A bfloat16 K/V cache (EngineConfig.kv_cache_dtype): speculation still gives plain decode's greedy output, the
cache really is bfloat16 and runs the compiled kernel (AMX tiles, or AVX512-BF16 dot products), and CPUs with
neither refuse it before anything is allocated."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.base import DrafterContext
from specdec.drafters.none import NoDrafter
from specdec.drafters.registry import build_drafter
from specdec.errors import ConfigError
from specdec.kernels import cpu as cpu_kernels
from specdec.models import fast_path
from specdec.models.loader import build_model
from specdec.models.quant import quantize_model_int8_
from specdec.tree.spec import TreeSpec, chain
from specdec.validation import check_kv_cache_dtype
from tests.helpers import run_all, tiny_config, tiny_engine, tiny_model

VOCAB = 24
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [9, 8, 7, 9, 8], [4, 4, 4, 4], list(range(1, 24)) * 3]


@pytest.fixture(scope="module")
def model():
    """Head size 32 (the tiles take multiples of 32), next-token distributions far from uniform."""
    model = build_model(tiny_config(VOCAB, hidden=128, heads=4, kv_heads=2), None, torch.float32,
                        torch.device("cpu"), seed=3)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(4)
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=gen) * 2.0)
    return model


def run(model, drafter, tree, kv_cache_dtype):
    engine = tiny_engine(model, drafter, tree, adaptive_speculation=False, kv_cache_dtype=kv_cache_dtype)
    seqs = [engine.add_request(p, SamplingParams(max_new_tokens=40, ignore_eos=True)) for p in PROMPTS]
    run_all(engine)
    assert engine.runner.cache.num_free_blocks == engine.runner.cache.pool.num_blocks
    return engine, [s.output_ids for s in seqs]


@pytest.mark.skipif(not cpu_kernels.bf16_attention(), reason="no AMX-BF16 or AVX512-BF16 on this CPU")
@pytest.mark.parametrize("spec,tree", [("hybrid:suffix+recycle", TreeSpec("dynamic", depth=4, topk=3, budget=8)),
                                       ("recycle", chain(4))])
def test_greedy_speculation_equals_plain_decode_over_a_bfloat16_cache(model, spec, tree):
    engine, plain = run(model, NoDrafter(), chain(0), "bfloat16")
    layer = engine.runner.cache.layers[0]
    assert layer[0].dtype == torch.bfloat16 and fast_path.applies(model, engine.runner.cache.layers)
    ctx = DrafterContext(SimpleNamespace(model=model, source="tiny"), EngineConfig(), torch.device("cpu"),
                         torch.float32, None)
    _, speculative = run(model, build_drafter(spec, ctx), tree, "bfloat16")
    assert speculative == plain


@pytest.mark.skipif(not cpu_kernels.bf16_attention(), reason="no AMX-BF16 or AVX512-BF16 on this CPU")
def test_an_int8_model_speculates_over_a_bfloat16_cache_with_plain_decodes_output(model):
    """An int8 model over a bfloat16 cache: greedy speculation still gives plain decode's output (every row of a
    tree through the int8 kernels and the bfloat16 attention)."""
    int8 = build_model(tiny_config(VOCAB, hidden=128, heads=4, kv_heads=2), None, torch.float32,
                       torch.device("cpu"), seed=3)
    with torch.no_grad():
        int8.lm_head.weight.copy_(model.lm_head.weight)
    quantize_model_int8_(int8)
    engine, plain = run(int8, NoDrafter(), chain(0), "bfloat16")
    assert engine.runner.cache.dtype == torch.bfloat16
    ctx = DrafterContext(SimpleNamespace(model=int8, source="tiny"), EngineConfig(), torch.device("cpu"),
                         torch.float32, None)
    _, speculative = run(int8, build_drafter("hybrid:suffix+recycle", ctx), TreeSpec("dynamic", depth=4, topk=3,
                                                                                      budget=8), "bfloat16")
    assert speculative == plain


def test_a_bfloat16_cache_is_refused_on_a_cpu_without_bf16_kernels(model, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "bf16_attention", lambda: False)
    with pytest.raises(ConfigError, match="AMX-BF16"):
        check_kv_cache_dtype(model, EngineConfig(kv_cache_dtype="bfloat16"))
    check_kv_cache_dtype(model, EngineConfig())  # the model's own precision is always fine


@pytest.mark.skipif(not cpu_kernels.available(), reason="the compiled CPU kernels are not available here")
def test_int8_serving_keeps_k_v_in_float32_even_where_bfloat16_kernels_serve(monkeypatch):
    """The serving policy's "auto" cache stays float32 where the bfloat16 kernels exist (quant.
    finish_int8_serving says why: measured, speculation gained less over it and the text came to depend on the
    CPU); bfloat16 is asked for."""
    monkeypatch.setattr(cpu_kernels, "bf16_attention", lambda: True)
    int8 = build_model(tiny_config(VOCAB, hidden=128, heads=4, kv_heads=2), None, torch.float32,
                       torch.device("cpu"), seed=3)
    quantize_model_int8_(int8)
    assert int8.kv_cache_dtype == torch.float32 and int8.cache_dtype("bfloat16") == torch.bfloat16
    check_kv_cache_dtype(int8, EngineConfig(kv_cache_dtype="bfloat16"))


def test_a_float32_cache_is_refused_where_the_model_attends_in_float64(monkeypatch):
    """An int8 model on a CPU without the compiled kernels keeps a float64 cache (its torch attention is then
    batch-invariant); asking for float32 there would lose greedy speculative == plain output."""
    monkeypatch.setenv("SPECDEC_CPU_KERNELS", "0")
    int8 = tiny_model(0, vocab=64)
    quantize_model_int8_(int8)
    assert int8.kv_cache_dtype == torch.float64
    with pytest.raises(ConfigError, match="float64"):
        check_kv_cache_dtype(int8, EngineConfig(kv_cache_dtype="float32"))
    check_kv_cache_dtype(int8, EngineConfig())
    check_kv_cache_dtype(tiny_model(0, vocab=64), EngineConfig(kv_cache_dtype="float32"))  # a float32 model's own


def test_a_bfloat16_model_keeps_its_own_cache_under_auto_on_any_cpu(monkeypatch):
    """A model whose weights are bfloat16 has a bfloat16 cache of its own, served by the torch reference: "auto"
    never refuses it; asking for bfloat16 explicitly is the kernels' business, and refused without them."""
    monkeypatch.setattr(cpu_kernels, "bf16_attention", lambda: False)
    bf16 = build_model(tiny_config(VOCAB), None, torch.bfloat16, torch.device("cpu"), seed=3)
    assert bf16.kv_cache_dtype == torch.bfloat16
    check_kv_cache_dtype(bf16, EngineConfig())
    with pytest.raises(ConfigError, match="AMX-BF16.*use 'auto'"):
        check_kv_cache_dtype(bf16, EngineConfig(kv_cache_dtype="bfloat16"))


def test_an_unknown_cache_precision_is_one_clear_error():
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of"):
        EngineConfig(kv_cache_dtype="fp8")
