"""The CPU fast path of the llama forward (specdec/models/fast_path.py) against the plain forward it replaces,
for float32, fbgemm int8 and QLinear int8/int4 layers, on a batch mixing a prefill chunk, a decode and a tree."""

from __future__ import annotations

import pytest
import torch

from specdec.kernels import cpu
from specdec.kvcache import BlockTable, PagedKVCache
from specdec.models import fast_path
from specdec.models.context import AttentionContext
from tests.helpers import tiny_config

pytestmark = pytest.mark.skipif(not cpu.available(), reason="compiled CPU kernels unavailable (no C++ compiler?)")


def _model(seed: int, qkv_bias: bool = False):
    from dataclasses import replace

    from specdec.models.loader import build_model

    config = replace(tiny_config(vocab=40, layers=3, hidden=64, heads=4, kv_heads=2), qkv_bias=qkv_bias)
    model = build_model(config, None, torch.float32, torch.device("cpu"), seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # every tensor its own random values; norms away from one
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def _quantize(model, kind: str) -> None:
    from specdec.models.qlinear import QLinear
    from specdec.models.quant import quantize_int8_

    if kind == "fbgemm":
        quantize_int8_(model)
    elif kind in ("q8", "q4"):
        quantize_int8_(model, make=lambda lin: QLinear.from_linear(lin, bits=8 if lin is model.lm_head or kind == "q8" else 4))


def _forward(model, monkeypatch, fast: bool, **kwargs):
    """One pass over: a 6-token prefill, a decode after 9 cached tokens, a 4-node tree after 5 cached tokens.
    Not fast: the plain forward on the torch reference kernels throughout (attention included)."""
    monkeypatch.setattr(fast_path, "applies", lambda *_: fast)
    monkeypatch.setenv("SPECDEC_CPU_KERNELS", "1" if fast else "0")
    c = model.config
    cache = PagedKVCache(c.num_layers, 32, 4, c.num_kv_heads, c.head_dim)
    gen = torch.Generator().manual_seed(0)
    tables = [BlockTable(), BlockTable(), BlockTable()]
    for table, n in zip(tables[1:], (9, 5)):  # cached prefixes, written by a plain prefill
        slots = cache.append(table, n)
        ids = torch.randint(0, c.vocab_size, (n,), generator=gen)
        ctx = AttentionContext.build([table.blocks], [0], [n], slots, torch.device("cpu"))
        model(ids, torch.arange(n), ctx, cache.layers)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    prefixes = [t.length for t in tables]
    counts = [6, 1, 4]
    slots = [s for t, n in zip(tables, counts) for s in cache.append(t, n)]
    ctx = AttentionContext.build([t.blocks for t in tables], prefixes, counts, slots, torch.device("cpu"),
                                 [None, None, mask])
    ids = torch.randint(0, c.vocab_size, (11,), generator=gen)
    positions = torch.tensor(list(range(6)) + [9] + [5, 6, 6, 7])
    with torch.inference_mode():
        return model(ids, positions, ctx, cache.layers, **kwargs), cache


@pytest.mark.parametrize("kind,tol", [("fp32", 1e-5), ("fbgemm", 2e-2), ("q8", 2e-2), ("q4", 2e-2)])
def test_fast_path_matches_the_plain_forward(monkeypatch, kind, tol):
    model = _model(1, qkv_bias=kind == "fbgemm")
    _quantize(model, kind)
    fast, fast_cache = _forward(model, monkeypatch, True, return_hidden=True, capture_layers=(1, 2))
    plain, plain_cache = _forward(model, monkeypatch, False, return_hidden=True, capture_layers=(1, 2))
    scale = plain.logits.abs().max()
    torch.testing.assert_close(fast.logits, plain.logits, atol=tol * scale, rtol=0)
    torch.testing.assert_close(fast.hidden, plain.hidden, atol=tol * plain.hidden.abs().max(), rtol=0)
    for layer in (1, 2):
        torch.testing.assert_close(fast.layer_inputs[layer], plain.layer_inputs[layer],
                                   atol=tol * plain.layer_inputs[layer].abs().max(), rtol=0)
    for (fk, fv), (pk, pv) in zip(fast_cache.layers, plain_cache.layers):  # the K/V both leave in the cache
        torch.testing.assert_close(fk, pk, atol=tol * pk.abs().max(), rtol=0)
        torch.testing.assert_close(fv, pv, atol=tol * pv.abs().max(), rtol=0)


@pytest.mark.parametrize("kind", ["fp32", "q8", "q4"])
def test_one_call_layers_equal_the_step_by_step_loop_bit_for_bit(monkeypatch, kind):
    """decode_layers (all layers in one C++ call) runs the same kernels as the Python loop, which a capture of
    layer 0's input forces (EAGLE-3 features): the same bits."""
    model = _model(4)
    _quantize(model, kind)
    one_call, one_cache = _forward(model, monkeypatch, True)
    loop, loop_cache = _forward(model, monkeypatch, True, capture_layers=(0,))
    assert loop.layer_inputs and not one_call.layer_inputs
    assert torch.equal(one_call.logits, loop.logits)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(one_cache.layers, loop_cache.layers))


def test_fast_path_comparison_can_fail(monkeypatch):
    """The comparisons above notice a wrong kernel (a rope that half forgets the bias, in the loop) and a wrong
    plan for the one-call path (a bias on every linear)."""
    model = _model(2, qkv_bias=True)
    plain, _ = _forward(model, monkeypatch, False)
    real = cpu.rope_kv
    monkeypatch.setattr(cpu, "rope_kv", lambda qkv, scale, bias, *rest: real(qkv - model.layers[0].self_attn.qkv_proj.bias
                                                                            * 0.5, scale, bias, *rest))
    broken, _ = _forward(model, monkeypatch, True, capture_layers=(0,))
    assert not torch.allclose(broken.logits, plain.logits, atol=1e-3 * plain.logits.abs().max())
    monkeypatch.setattr(cpu, "rope_kv", real)
    real_plan = fast_path.linear_params

    def negated_bias(linear):  # every qkv, o, gate_up and down of the one-call plan gets a wrong bias
        kind, params = real_plan(linear)
        return kind, params[:3] + [torch.ones(linear.out_features)]

    monkeypatch.setattr(fast_path, "linear_params", negated_bias)
    object.__setattr__(model, "_fast_path_plan", None)  # rebuild the plan with the wrong biases
    broken, _ = _forward(model, monkeypatch, True)
    assert not torch.allclose(broken.logits, plain.logits, atol=1e-3 * plain.logits.abs().max())


def test_fast_path_serves_float32_cpu_models_only():
    model = _model(3)
    c = model.config
    fp32 = PagedKVCache(c.num_layers, 4, 4, c.num_kv_heads, c.head_dim)
    fp64 = PagedKVCache(c.num_layers, 4, 4, c.num_kv_heads, c.head_dim, dtype=torch.float64)
    assert fast_path.applies(model, fp32.layers)
    assert not fast_path.applies(model, fp64.layers)  # int8 without kernels: float64 attention, plain path
    assert not fast_path.applies(model.to(torch.bfloat16), fp32.layers)


def test_quantizing_after_a_forward_rebuilds_the_one_call_plan(monkeypatch):
    model, fresh = _model(5), _model(5)
    _forward(model, monkeypatch, True)  # a plan of float linears, cached on the model
    _quantize(model, "q8")
    _quantize(fresh, "q8")
    assert torch.equal(_forward(model, monkeypatch, True)[0].logits, _forward(fresh, monkeypatch, True)[0].logits)
