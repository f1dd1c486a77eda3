"""QLinear (int8/int7/int4 weights on our own kernels) and the int8 serving policy that picks it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specdec.errors import ConfigError
from specdec.kernels import cpu
from specdec.models.qlinear import QLinear, quantize_weight_q4
from specdec.models.quant import Int8DynamicLinear, quantize_model_int8_
from tests.helpers import tiny_model

needs_kernels = pytest.mark.skipif(not cpu.available(), reason="compiled CPU kernels unavailable (no C++ compiler?)")


def q4_1_weight(n: int, k: int, seed: int) -> torch.Tensor:
    """A weight exactly representable in GGUF's Q4_1: per group of 32, w = d q + m with float16 d and m."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k // 32, 32), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15  # every group uses the full range, as the Q4_1 quantizer makes it
    d = (torch.rand(n, k // 32, 1, generator=gen) * 0.01 + 1e-3).half().float()
    m = (torch.randn(n, k // 32, 1, generator=gen) * 0.05).half().float()
    return (q * d + m).reshape(n, k)


def test_int4_rebuilds_a_q4_1_weight_exactly():
    weight = q4_1_weight(24, 96, 0)
    layer = QLinear.from_linear(_with_weight(weight), bits=4)
    torch.testing.assert_close(layer.dequantized_weight(), weight, atol=0, rtol=1e-6)


def _with_weight(weight: torch.Tensor, bias: bool = False) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias)
    with torch.no_grad():
        lin.weight.copy_(weight)
    return lin


def test_int4_packing_layout():
    """Byte j of a group: value j in the low nibble, value j + 16 in the high one."""
    weight = torch.arange(32, dtype=torch.float32)[None].repeat(2, 1) % 16
    packed, d, m_t = quantize_weight_q4(weight)
    assert packed.shape == (2, 16) and d.dtype == torch.float16 and m_t.shape == (1, 2)
    assert packed[0, 3].item() == (3 | (3 << 4)) and packed[0, 15].item() == (15 | (15 << 4))


@needs_kernels
@pytest.mark.parametrize("bits,limit", [(8, 0.015), (7, 0.02), (4, 0.015)])
def test_qlinear_is_close_to_the_float_layer(bits, limit):
    """int4 on a Q4_1 weight: the only error left is the activations' (8 bits a row)."""
    lin = _with_weight(q4_1_weight(64, 192, 1), bias=True)
    layer = QLinear.from_linear(lin, bits=bits)
    x = torch.randn(3, 5, 192, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = lin(x)
    got = layer(x)
    assert got.shape == want.shape
    assert ((got - want).norm() / want.norm()) < limit


def test_int7_weights_lie_on_a_grid_of_63_steps_and_err_about_twice_as_much_as_int8():
    """int7 is int8 storage on half the grid: the weight rounding error (step / sqrt(12) per weight) doubles."""
    lin = _with_weight(torch.randn(64, 192, generator=torch.Generator().manual_seed(5)))
    w8, w7 = (QLinear.from_linear(lin, bits=b) for b in (8, 7))
    assert int(w7.weight.abs().max()) == 63 and int(w8.weight.abs().max()) == 127
    err8, err7 = ((layer.dequantized_weight() - lin.weight).norm() for layer in (w8, w7))
    assert 1.6 < err7 / err8 < 2.4


@needs_kernels
def test_qlinear_rows_do_not_depend_on_their_batch():
    layer = QLinear.from_linear(_with_weight(q4_1_weight(40, 64, 3)), bits=4)
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(4))
    x[4] *= 100  # a loud row does not coarsen the others
    alone = torch.cat([layer(x[i: i + 1]) for i in range(9)])
    assert torch.equal(layer(x), alone)


def test_qlinear_rejects_widths_it_cannot_tile():
    with pytest.raises(ValueError, match="divisible by 32"):
        QLinear.from_linear(nn.Linear(40, 8))


# ---- the serving policy --------------------------------------------------------------------------------
@needs_kernels
@pytest.mark.parametrize("bits", [8, 7, 4])
def test_policy_with_kernels_uses_qlinear_and_a_float32_cache(bits):
    model = tiny_model(0, vocab=64)
    quantize_model_int8_(model, bits=bits)
    assert model.config.kv_cache_dtype is None and model.kv_cache_dtype == torch.float32
    layer = model.layers[0].mlp.down_proj
    assert isinstance(layer, QLinear) and layer.bits == bits
    assert isinstance(model.lm_head, QLinear) and model.lm_head.bits == (8 if bits == 4 else bits)  # int4: 8-bit head


def test_policy_without_kernels_falls_back_to_fbgemm_and_float64_attention(monkeypatch):
    monkeypatch.setenv("SPECDEC_CPU_KERNELS", "0")
    model = tiny_model(0, vocab=64)
    quantize_model_int8_(model)
    assert model.config.kv_cache_dtype == "float64" and model.kv_cache_dtype == torch.float64
    assert isinstance(model.layers[0].self_attn.qkv_proj, Int8DynamicLinear)
    with pytest.raises(ConfigError, match="compiled CPU kernels"):
        quantize_model_int8_(tiny_model(1, vocab=64), bits=4)
