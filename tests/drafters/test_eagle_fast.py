"""The EAGLE predictor's kernel path (specdec/drafters/heads/eagle_fast.py) against its module path: the same
hidden states and the same K/V written to the drafter's cache, for causal rows and for tree rows, with float
and with int8 linears; and it steps aside where it does not apply."""

from __future__ import annotations

import pytest
import torch

from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.heads import eagle_fast
from specdec.drafters.model_drafter import Feed
from specdec.kernels import cpu as cpu_kernels
from specdec.models.quant import quantize_drafter_int8_
from specdec.models.split_input import SplitInputLinear
from tests.drafters.test_eagle import feature_layers, random_predictor
from specdec.tree.spec import chain
from tests.helpers import run_all, tiny_engine, tiny_model

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="compiled CPU kernels unavailable")

TREE = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)  # root, 2 kids


def _drafter_with_history(int8: bool, version: int, split: bool = False):
    target = tiny_model(seed=5, vocab=32, sharpness=3.0)
    predictor = random_predictor(target, version, seed=2)
    if split:  # as build_eagle does for an int8 EAGLE-1 target: fc cut by input, each part its own scale
        width = predictor.config.hidden_size
        predictor.fc = SplitInputLinear.from_linear(predictor.fc, (width, predictor.fc.in_features - width))
    if int8:
        assert quantize_drafter_int8_(predictor) > 0
    drafter = EagleDrafter(predictor, target, EngineConfig(), feature_layers=feature_layers(version))
    engine = tiny_engine(target, drafter, chain(3), adaptive_speculation=False)
    seq = engine.add_request([3, 1, 4, 1, 5, 9, 2, 6], SamplingParams(max_new_tokens=6, ignore_eos=True))
    for _ in range(3):
        engine.step()
    return drafter, seq


def _run(drafter: EagleDrafter, feed: Feed, fast: bool, monkeypatch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One draft forward over `feed`, its hidden rows and the K/V it wrote; the cache is put back after."""
    monkeypatch.setattr(eagle_fast, "applies", (lambda *a: True) if fast else (lambda *a: False))
    length = feed.table.length
    hidden = drafter._forward([feed])[0]
    k, v = drafter.cache.gather(feed.table, 0)
    written = [k[length:].clone(), v[length:].clone()]
    drafter.cache.truncate(feed.table, length)
    return hidden, written


@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
@pytest.mark.parametrize("mask", [None, TREE], ids=["causal", "tree"])
@pytest.mark.parametrize("version,width", [(1, 1), (3, 3), (3, 1)], ids=["eagle", "eagle3-target", "eagle3-own"])
def test_kernel_path_equals_the_module_path(monkeypatch, int8, mask, version, width):
    """EAGLE-3 takes the target's three feature streams (3H, through fc) or its own output (H, past fc)."""
    drafter, seq = _drafter_with_history(int8, version)
    table = drafter.table(seq)
    hidden_size = drafter.predictor.config.hidden_size
    features = torch.randn(4, width * hidden_size, generator=torch.Generator().manual_seed(7))
    kept = features.clone()
    depths = [0, 1, 1, 2] if mask is not None else [0, 1, 2, 3]
    feed = Feed(table, [5, 7, 11, 13], [table.length + d for d in depths], features, mask)
    ref_hidden, ref_kv = _run(drafter, feed, False, monkeypatch)
    fast_hidden, fast_kv = _run(drafter, feed, True, monkeypatch)
    assert torch.equal(features, kept)  # the caller's features are read, never written
    # float: the same arithmetic up to rounding; int8: a rounding difference can move an activation by one
    # quantization step (1/127 of its row's largest value).
    tol = dict(atol=3e-2, rtol=3e-2) if int8 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast_hidden, ref_hidden, **tol)
    for fast, ref in zip(fast_kv, ref_kv):
        torch.testing.assert_close(fast, ref, **tol)
    assert float((fast_hidden - ref_hidden).abs().max()) < 0.05 * float(ref_hidden.abs().max())


@pytest.mark.parametrize("int8", [False, True], ids=["float", "int8"])
@pytest.mark.parametrize("mask", [None, TREE], ids=["causal", "tree"])
def test_one_call_layer_equals_the_kernel_calls(monkeypatch, int8, mask):
    """`eagle_layer` (the whole EAGLE-1 layer in one C++ call) gives the bits of the same kernels called one by
    one from Python, hidden rows and K/V alike; a predictor whose fc is not split by input takes the latter."""
    drafter, seq = _drafter_with_history(int8, 1, split=True)
    assert eagle_fast._one_call_weights(drafter.predictor) is not None
    table = drafter.table(seq)
    features = torch.randn(4, drafter.predictor.config.hidden_size, generator=torch.Generator().manual_seed(3))
    depths = [0, 1, 1, 2] if mask is not None else [0, 1, 2, 3]
    feed = Feed(table, [5, 7, 11, 13], [table.length + d for d in depths], features, mask)
    one_call = _run(drafter, feed, True, monkeypatch)
    monkeypatch.setattr(eagle_fast, "_one_call_weights", lambda predictor: None)
    by_kernel = _run(drafter, feed, True, monkeypatch)
    assert torch.equal(one_call[0], by_kernel[0])
    for a, b in zip(one_call[1], by_kernel[1]):
        assert torch.equal(a, b)
    unsplit, _ = _drafter_with_history(int8, 1)
    assert eagle_fast._one_call_weights(unsplit.predictor) is None


def test_one_call_weights_follow_a_replaced_linear():
    """The cached weights are rebuilt when a linear is replaced (quantizing after a first forward, say)."""
    drafter, _ = _drafter_with_history(False, 1, split=True)
    before = eagle_fast._one_call_weights(drafter.predictor)
    assert eagle_fast._one_call_weights(drafter.predictor) is before
    quantize_drafter_int8_(drafter.predictor)
    after = eagle_fast._one_call_weights(drafter.predictor)
    assert after is not None and after is not before


def test_greedy_output_unchanged_and_cache_freed():
    target = tiny_model(seed=3, vocab=32, sharpness=3.0)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    plain = tiny_engine(target, EagleDrafter(random_predictor(target, 1), target, EngineConfig()), chain(0))
    expected = plain.add_request([1, 2, 3, 4, 5], params)
    run_all(plain)
    predictor = random_predictor(target, 1)
    quantize_drafter_int8_(predictor)
    drafter = EagleDrafter(predictor, target, EngineConfig())
    engine = tiny_engine(target, drafter, chain(3), adaptive_speculation=False)
    seq = engine.add_request([1, 2, 3, 4, 5], params)
    run_all(engine)
    assert seq.output_ids == expected.output_ids
    assert drafter.cache.num_free_blocks == drafter.cache.pool.num_blocks


def test_applies_only_in_float32_on_cpu(monkeypatch):
    target = tiny_model(seed=1, vocab=32)
    one, three = random_predictor(target, 1), random_predictor(target, 3)
    rows = torch.zeros(2, 32)
    cache = torch.zeros(4, 16, 2, 8)
    assert eagle_fast.applies(one, rows, cache) and eagle_fast.applies(three, rows, cache)
    assert not eagle_fast.applies(one, rows.double(), cache)
    assert not eagle_fast.applies(one, rows, cache.double())
    monkeypatch.setenv("SPECDEC_CPU_KERNELS", "0")
    assert not eagle_fast.applies(one, rows, cache)
