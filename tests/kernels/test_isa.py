"""The AVX-512 paths of the compiled CPU kernels give the AVX2 paths' bits, so which instruction set a machine
has never changes a token: the int8 and int4 linears' VNNI tiles (qlinear_vnni.cpp: the same exact integer
sums) and attention's three-heads-at-a-time blocks (attention_rows.h: the same multiply-adds per query and key,
in the same order). The comparisons run where the CPU has AVX-512; the switch itself is checked everywhere."""

from __future__ import annotations

import contextlib

import pytest
import torch

from specdec.kernels import cpu, reference
from specdec.kernels.reference import Q8

pytestmark = pytest.mark.skipif(not cpu.available(), reason="compiled CPU kernels unavailable (no C++ compiler?)")


def _has_avx512() -> bool:
    if not cpu.available():
        return False
    with _isa("avx512") as isa:
        return isa == "avx512"


@contextlib.contextmanager
def _isa(request: str):
    before = cpu.isa()
    try:
        yield cpu.isa(request)
    finally:
        cpu.isa("avx512" if before == "avx512" else "avx2")


needs_avx512 = pytest.mark.skipif(not _has_avx512(), reason="this CPU has no AVX-512 (F, BW, DQ, VL, VNNI)")


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
    with _isa("avx512"):
        fast = run()
    return slow, fast


def test_the_switch_reports_what_runs():
    with _isa("avx2") as isa:
        assert isa in ("avx2", "scalar")
        assert cpu.isa() == isa
    with _isa("avx512") as isa:
        assert isa == ("avx512" if _has_avx512() else cpu.isa("avx2"))
    with pytest.raises(RuntimeError, match="request must be"):
        cpu.isa("sse")


@needs_avx512
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 33])
@pytest.mark.parametrize("k,n", [(64, 13), (576, 72), (1536, 4)])
def test_vnni_q8_tiles_equal_avx2_and_the_reference(rows, k, n):
    """Row counts cover every block size (8, 4, 2, 1) and their mixes; n = 13 pads the last tile."""
    (q, s, _), (w, w_scale), _, bias = _case(rows, k, n, rows + k)
    slow, fast = _both(lambda: cpu.linear_q8(q, s, w, w_scale, bias))
    assert torch.equal(fast, slow)
    assert torch.equal(fast, reference.linear_q8(q, s, w, w_scale, bias))


@needs_avx512
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 13])
@pytest.mark.parametrize("k,n", [(64, 13), (576, 72)])
def test_vnni_q4_tiles_equal_avx2(rows, k, n):
    (q, s, gsum), _, (w, d, m), bias = _case(rows, k, n, 100 + rows)
    slow, fast = _both(lambda: cpu.linear_q4(q, s, gsum, w, d, m, bias))
    assert torch.equal(fast, slow)


@needs_avx512
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


@needs_avx512
@pytest.mark.parametrize("tree", [None, "chain", "star", "random"])
@pytest.mark.parametrize("group,head_dim", [(1, 16), (3, 64), (4, 20), (6, 64), (7, 64)])
def test_wide_attention_equals_avx2(make_case, tree, group, head_dim):
    """Groups of 1 to 7 heads cover blocks of three, their remainders, and blocks that span rows; head size 20
    takes the plain-dot and one-dimension-at-a-time tails."""
    case = make_case(70 + group, [0, 11, 26, 40, 90], [5, 9, 1, 3, 12], kv_heads=2, group=group, head_dim=head_dim,
                     page=4, tree=tree)
    slow, fast = _both(lambda: cpu.paged_attention(*case.args()))
    assert torch.equal(fast, slow)


def test_isa_says_none_without_the_compiled_kernels(monkeypatch):
    """`isa()` answers for the torch reference too (it used to raise AttributeError when called before the
    kernels were loaded, or with them switched off)."""
    monkeypatch.setenv("SPECDEC_CPU_KERNELS", "0")
    assert cpu.isa() == "none"
    monkeypatch.delenv("SPECDEC_CPU_KERNELS")
    assert cpu.isa() in ("avx2", "avx512")
