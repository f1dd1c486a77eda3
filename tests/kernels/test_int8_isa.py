"""The int8 and int4 linears on AVX-512 VNNI (qlinear_vnni.cpp) give the AVX2 tiles' bits: the same exact integer
sums, so which instruction set a machine has never changes a token. The comparisons run where the CPU has VNNI;
the switch itself is checked everywhere."""

from __future__ import annotations

import contextlib

import pytest
import torch

from specdec.kernels import cpu, reference
from specdec.kernels.reference import Q8

pytestmark = pytest.mark.skipif(not cpu.available(), reason="compiled CPU kernels unavailable (no C++ compiler?)")


def _has_vnni() -> bool:
    if not cpu.available():
        return False
    with _isa("vnni") as isa:
        return isa == "avx512-vnni"


@contextlib.contextmanager
def _isa(request: str):
    before = cpu.int8_isa()
    try:
        yield cpu.int8_isa(request)
    finally:
        cpu.int8_isa("vnni" if before == "avx512-vnni" else "avx2")


needs_vnni = pytest.mark.skipif(not _has_vnni(), reason="this CPU has no AVX-512 VNNI")


def _case(rows: int, k: int, n: int, seed: int):
    from specdec.models.qlinear import quantize_weight_q4
    from specdec.models.quant import quantize_weight_per_channel

    gen = torch.Generator().manual_seed(seed)
    weight, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    q, s, gsum = reference.quantize(torch.randn(rows, k, generator=gen) * 4, Q8)
    w8, w_scale = quantize_weight_per_channel(weight)
    w4, d, m_t = quantize_weight_q4(weight)
    return (q, s, gsum), (reference.pack_q8(w8), w_scale), (*reference.pack_q4(w4, d), m_t), bias


def _both(run) -> tuple[torch.Tensor, torch.Tensor]:
    with _isa("avx2"):
        slow = run()
    with _isa("vnni"):
        fast = run()
    return slow, fast


def test_the_switch_reports_what_runs():
    with _isa("avx2") as isa:
        assert isa in ("avx2", "scalar")
        assert cpu.int8_isa() == isa
    with _isa("vnni") as isa:
        assert isa == ("avx512-vnni" if _has_vnni() else cpu.int8_isa("avx2"))
    with pytest.raises(RuntimeError, match="request must be"):
        cpu.int8_isa("sse")


@needs_vnni
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 33])
@pytest.mark.parametrize("k,n", [(64, 13), (576, 72), (1536, 4)])
def test_vnni_q8_tiles_equal_avx2_and_the_reference(rows, k, n):
    """Row counts cover every block size (8, 4, 2, 1) and their mixes; n = 13 pads the last tile."""
    (q, s, _), (w, w_scale), _, bias = _case(rows, k, n, rows + k)
    slow, fast = _both(lambda: cpu.linear_q8(q, s, w, w_scale, bias))
    assert torch.equal(fast, slow)
    assert torch.equal(fast, reference.linear_q8(q, s, w, w_scale, bias))


@needs_vnni
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 13])
@pytest.mark.parametrize("k,n", [(64, 13), (576, 72)])
def test_vnni_q4_tiles_equal_avx2(rows, k, n):
    (q, s, gsum), _, (w, d, m), bias = _case(rows, k, n, 100 + rows)
    slow, fast = _both(lambda: cpu.linear_q4(q, s, gsum, w, d, m, bias))
    assert torch.equal(fast, slow)


@needs_vnni
def test_vnni_q8_is_exact_at_the_extremes():
    """Every product at its largest magnitude, over a long row (8,960 inputs, Qwen's down projection): the
    w + 128 trick must neither saturate nor lose the correction term."""
    k, n = 8960, 8
    q = torch.full((3, k), -127, dtype=torch.int8)
    q[1] = 127
    q[2, ::2] = 127
    s = torch.ones(3, 1)
    w = torch.full((n, k), 127, dtype=torch.int8)
    w[1] = -127
    w[2, 1::3] = -128 + 1
    tiles, w_scale = reference.pack_q8(w), torch.ones(n)
    slow, fast = _both(lambda: cpu.linear_q8(q, s, tiles, w_scale))
    expected = (q.long() @ w.long().T).float()
    assert torch.equal(slow, expected)
    assert torch.equal(fast, expected)
