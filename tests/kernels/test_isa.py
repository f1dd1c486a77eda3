"""The AVX-512 and AMX paths of the compiled CPU kernels give the AVX2 paths' bits, so which instruction set a
machine has never changes a token: the int8 and int4 linears' VNNI tiles and the int8 linears' VNNI blocks
(qlinear_vnni.cpp: the same exact integer sums), the int8 linears' AMX tiles (qlinear_amx.cpp: the same again;
both blocked kernels on a second copy of the weights) and attention's three-heads-at-a-time blocks
(attention_rows.h: the same multiply-adds per query and key, in the same order). The comparisons run where the
CPU has AVX-512, or AMX; the switch and the blocked weight layout are checked everywhere. (A bfloat16 K/V cache,
asked for, is the exception: its two kernels round differently, and tests/kernels/test_cpu_kernels.py holds each
to its own contract.)"""

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
        cpu.isa(before if before in ("amx", "avx512") else "avx2")


def _has_amx() -> bool:
    if not cpu.available():
        return False
    with _isa("amx") as isa:
        return isa == "amx"


needs_avx512 = pytest.mark.skipif(not _has_avx512(), reason="this CPU has no AVX-512 (F, BW, DQ, VL, VNNI)")
needs_amx = pytest.mark.skipif(not _has_amx(), reason="this CPU (or its kernel) offers no AMX-INT8")


def _case(rows: int, k: int, n: int, seed: int):
    from specdec.models.qlinear import quantize_weight_q4
    from specdec.models.quant import quantize_weight_per_channel

    gen = torch.Generator().manual_seed(seed)
    weight, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    q, s, gsum = reference.quantize(torch.randn(rows, k, generator=gen) * 4, Q8)
    w8, w_scale = quantize_weight_per_channel(weight)
    w4, d, m_t = quantize_weight_q4(weight)
    return (q, s, gsum), (reference.pack_q8(w8), w_scale), (*reference.pack_q4(w4, d), m_t), bias


def _extremes() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """18 rows of 8,960 inputs (Qwen's down projection) and 20 channels where every product has its largest
    magnitude, with signs mixed by row and channel: (q, w, pack_q8 tiles of w, channels)."""
    k, n = 8960, 20
    q = torch.full((18, k), -127, dtype=torch.int8)
    q[1::3] = 127
    q[2::3, ::2] = 127
    w = torch.full((n, k), 127, dtype=torch.int8)
    w[1::2] = -127
    w[2, 1::3] = -128 + 1
    return q, w, reference.pack_q8(w), n


def _both(run, slow: str = "avx2", fast: str = "avx512") -> tuple[torch.Tensor, torch.Tensor]:
    """`run()` at two levels of the switch."""
    with _isa(slow):
        before = run()
    with _isa(fast):
        after = run()
    return before, after


def test_the_switch_reports_what_runs():
    with _isa("avx2") as isa:
        assert isa in ("avx2", "scalar")
        assert cpu.isa() == isa
    with _isa("avx512") as isa:
        assert isa == ("avx512" if _has_avx512() else cpu.isa("avx2"))
    with _isa("amx") as isa:  # the best level up to AMX that this CPU has
        assert isa == ("amx" if _has_amx() else "avx512" if _has_avx512() else cpu.isa("avx2"))
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
@pytest.mark.parametrize("bits", [8, 7])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 33])
@pytest.mark.parametrize("k,n", [(64, 13), (576, 72), (1536, 40)])
def test_vnni_q8_blocks_equal_avx2_and_the_reference(bits, rows, k, n):
    """The VNNI kernel with channels in lanes, on the blocked copy: row counts cover every pass size (1-8) and
    passes of eight with a rest; n = 13 and 40 leave a block partly padding."""
    from specdec.models.quant import quantize_weight_per_channel

    gen = torch.Generator().manual_seed(rows + k + bits)
    w, w_scale = quantize_weight_per_channel(torch.randn(n, k, generator=gen), bits)
    q, s, _ = reference.quantize(torch.randn(rows, k, generator=gen) * 4, Q8)
    tiles, bias = reference.pack_q8(w), torch.randn(n, generator=gen)
    blocks = reference.pack_q8_blocks(tiles, n)
    slow, fast = _both(lambda: cpu.linear_q8(q, s, tiles, w_scale, bias, bits, blocks))
    assert torch.equal(fast, slow)
    assert torch.equal(fast, reference.linear_q8(q, s, tiles, w_scale, bias, bits))


@needs_avx512
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 18])
def test_vnni_q8_blocks_are_exact_at_the_extremes(rows):
    """Every product at its largest magnitude over 8,960 inputs (Qwen's down projection), at each pass size's
    accumulator count (four sets for two rows, two for five, one for eight): no saturation, no lost term."""
    q, w, tiles, n = _extremes()
    with _isa("avx512"):
        out = cpu.linear_q8(q[:rows], torch.ones(rows, 1), tiles, torch.ones(n), None, 8,
                            reference.pack_q8_blocks(tiles, n))
    assert torch.equal(out, (q[:rows].long() @ w.long().T).float())


@needs_avx512
def test_the_vnni_level_reads_the_blocked_copy_at_every_row_count():
    """A copy that disagrees with the tiles shows in the output at the avx512 level (so the comparisons above
    measured the blocked kernel, not a silent fallback to the tiles), and the avx2 level ignores it."""
    w = torch.randint(-127, 128, (32, 64), dtype=torch.int8, generator=torch.Generator().manual_seed(5))
    tiles, w_scale = reference.pack_q8(w), torch.ones(32)
    wrong = reference.pack_q8_blocks(reference.pack_q8(-w), 32)
    for rows in (1, 3, 9):
        q, s, _ = reference.quantize(torch.randn(rows, 64), Q8)
        expected = reference.linear_q8(q, s, tiles, w_scale)
        with _isa("avx512"):
            assert torch.equal(cpu.linear_q8(q, s, tiles, w_scale, None, 8, wrong), -expected)
        with _isa("avx2"):
            assert torch.equal(cpu.linear_q8(q, s, tiles, w_scale, None, 8, wrong), expected)


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
    assert cpu.isa() in ("avx2", "avx512", "amx")


def test_the_amx_layout_holds_each_tile_in_tdpbssd_order():
    """Block b, step j, row i, column 4c + t holds W[16b + c, 64j + 4i + t]; padding channels are 0."""
    n, k = 21, 128
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=torch.Generator().manual_seed(3))
    packed = reference.pack_q8_blocks(reference.pack_q8(w), n).view(2, k // 64, 16, 64)
    for b, j, i, c, t in [(0, 0, 0, 0, 0), (0, 1, 5, 7, 3), (1, 0, 15, 4, 2), (1, 1, 9, 0, 1)]:
        assert packed[b, j, i, 4 * c + t] == w[16 * b + c, 64 * j + 4 * i + t]
    assert not packed[1, :, :, 4 * (n - 16):].any()
    with pytest.raises(ValueError, match="divisible by 64"):
        reference.pack_q8_blocks(reference.pack_q8(w[:, :96]), n)


@needs_amx
@pytest.mark.parametrize("bits", [8, 7])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 15, 16, 17, 33, 64, 65, 100])
@pytest.mark.parametrize("k,n", [(64, 13), (576, 72), (1536, 4)])
def test_amx_q8_tiles_equal_vnni_and_the_reference(bits, rows, k, n):
    """Row counts cover one partial tile, whole tiles, a pass of four tiles and the passes after it; n = 13
    and 4 leave most of a block of 16 channels as padding."""
    from specdec.models.quant import quantize_weight_per_channel

    gen = torch.Generator().manual_seed(rows + k + bits)
    w, w_scale = quantize_weight_per_channel(torch.randn(n, k, generator=gen), bits)
    q, s, _ = reference.quantize(torch.randn(rows, k, generator=gen) * 4, Q8)
    tiles, bias = reference.pack_q8(w), torch.randn(n, generator=gen)
    w_blocks = reference.pack_q8_blocks(tiles, n)
    vnni, amx = _both(lambda: cpu.linear_q8(q, s, tiles, w_scale, bias, bits, w_blocks), "avx512", "amx")
    assert torch.equal(amx, vnni)
    assert torch.equal(amx, reference.linear_q8(q, s, tiles, w_scale, bias, bits))


@needs_amx
def test_amx_q8_is_exact_at_the_extremes():
    """Every product at its largest magnitude over 8,960 inputs (Qwen's down projection), in whole and partial
    row tiles: the int32 sums must come out exact."""
    q, w, tiles, n = _extremes()
    _, amx = _both(lambda: cpu.linear_q8(q, torch.ones(18, 1), tiles, torch.ones(n), None, 8,
                                         reference.pack_q8_blocks(tiles, n)), "avx512", "amx")
    assert torch.equal(amx, (q.long() @ w.long().T).float())


@needs_avx512
def test_qlinear_carries_the_blocked_copy_only_where_it_runs():
    """A layer built at the avx512 or amx level packs its weights in blocks (and gives the same output at every
    level); one built at avx2 carries no copy; in_features not divisible by 64 never does."""
    from specdec.models.qlinear import QLinear

    linear = torch.nn.Linear(128, 40)
    x = torch.randn(5, 128)
    with _isa("amx"):
        layer = QLinear.from_linear(linear)
        odd = QLinear.from_linear(torch.nn.Linear(96, 8))
        assert layer.weight_blocks is not None and odd.weight_blocks is None
        assert "weight_blocks" not in layer.state_dict()
        best = layer(x)
    with _isa("avx2"):
        assert QLinear.from_linear(linear).weight_blocks is None
        assert torch.equal(layer(x), best)
    with _isa("avx512"):
        assert QLinear.from_linear(linear).weight_blocks is not None
        assert torch.equal(layer(x), best)


@needs_amx
def test_the_amx_level_reads_the_blocked_copy_at_every_row_count():
    """A copy that disagrees with the tiles shows in the output at one row (the VNNI kernel with channels in
    lanes) and from two rows on (the AMX tiles), so the comparisons above measured the blocked paths, not a
    silent fallback to the tiles."""
    w = torch.randint(-127, 128, (32, 64), dtype=torch.int8, generator=torch.Generator().manual_seed(5))
    tiles, w_scale = reference.pack_q8(w), torch.ones(32)
    wrong = reference.pack_q8_blocks(reference.pack_q8(-w), 32)
    q, s, _ = reference.quantize(torch.randn(2, 64), Q8)
    with _isa("amx"):
        assert torch.equal(cpu.linear_q8(q[:1], s[:1], tiles, w_scale, None, 8, wrong),
                           -reference.linear_q8(q[:1], s[:1], tiles, w_scale))
        assert torch.equal(cpu.linear_q8(q, s, tiles, w_scale, None, 8, wrong),
                           -reference.linear_q8(q, s, tiles, w_scale))


def test_the_environment_switch_names_a_level_and_ignores_anything_else():
    """SPECDEC_CPU_ISA=avx2 holds a process to AVX2; a value that names no level leaves the best one."""
    import os
    import subprocess
    import sys

    def level(value: str) -> str:
        code = "from specdec.kernels import cpu; print(cpu.isa())"
        env = {**os.environ, "SPECDEC_CPU_ISA": value}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert level("avx2") in ("avx2", "scalar")
    assert level("sse") == level("")


@needs_avx512
@pytest.mark.parametrize("n,mode", [(8, 0), (40, 0), (40, 1), (96, 2), (1536, 0), (1536, 1), (1536, 2)])
@pytest.mark.parametrize("scaled", [False, True])
def test_sixteen_lane_silu_gives_the_eight_lane_bits(n, mode, scaled):
    """silu(gate) * up runs its exps sixteen lanes at a time on AVX-512; every output form keeps the AVX2 bits
    (n = 40 leaves an eight-lane tail, n = 8 runs no sixteen-lane chunk at all; q8 rows are multiples of 32)."""
    gen = torch.Generator().manual_seed(n + mode)
    gate_up = torch.randn(5, 2 * n, generator=gen) * 6.0
    gate_up[0, :4] = torch.tensor([0.0, -0.0, 90.0, -90.0])  # a zero of each sign, overflow and underflow
    scale = torch.rand(5, 1, generator=gen) + 0.5 if scaled else None
    slow, fast = _both(lambda: cpu.silu_mul(gate_up, scale, mode))
    for a, b in zip(slow, fast):
        assert torch.equal(a, b)


@needs_avx512
@pytest.mark.parametrize("v", [8, 63, 64, 100, 49152])
def test_sixteen_lane_argmax_gives_the_eight_lane_indices(v):
    logits = torch.randn(6, v, generator=torch.Generator().manual_seed(v))
    logits[1] = 0.0  # all equal: index 0
    logits[2, v // 3] = logits[2, v - 1] = 9.0  # a tie: the first wins
    logits[3, v - 1] = float("nan")
    logits[4, v // 2] = float("inf")
    logits[5, 0] = -float("inf")
    slow, fast = _both(lambda: cpu.argmax_rows(logits))
    assert torch.equal(slow, fast)
    assert fast[1] == 0 and fast[2] == v // 3 and fast[3] == -1 and fast[4] == -1


@needs_avx512
@pytest.mark.parametrize("v", [8, 100, 49152])
def test_sixteen_lane_softmax_sums_give_the_eight_lane_top_k_probabilities(v):
    logits = torch.randn(7, v, generator=torch.Generator().manual_seed(v)) * 4.0
    logits[0, :3] = torch.tensor([-200.0, 30.0, 30.0])  # an underflowing exp and a tie
    (p_slow, i_slow), (p_fast, i_fast) = _both(lambda: cpu.top_k_probs(logits, 4))
    assert torch.equal(i_slow, i_fast) and torch.equal(p_slow, p_fast)
    want = torch.softmax(logits.double(), dim=-1).topk(4, dim=-1).values.float()
    torch.testing.assert_close(p_fast, want, rtol=1e-5, atol=1e-7)
