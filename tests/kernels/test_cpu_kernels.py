"""The compiled CPU kernels (specdec/kernels/cpu) against their torch references, and the property they exist
for: a row's result is the same bits alone, in a batch, and as a tree node."""

from __future__ import annotations

import contextlib

import pytest
import torch

from specdec.kernels import cpu, reference
from specdec.kernels.reference import FLOAT, Q8, ROWSCALE

pytestmark = pytest.mark.skipif(not cpu.available(), reason="compiled CPU kernels unavailable (no C++ compiler?)")


# ---- attention --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tree", [None, "chain", "star", "random"])
@pytest.mark.parametrize("group,head_dim", [(1, 16), (3, 64), (4, 20)])
def test_attention_matches_the_float64_reference(make_case, tree, group, head_dim):
    """Unused cache slots are NaN in these cases: the kernel must never read a slot its sequence does not own."""
    case = make_case(50 + group, [0, 11, 26, 40], [5, 9, 1, 3], kv_heads=2, group=group, head_dim=head_dim, page=4,
                     tree=tree, strided_q=tree == "random")
    expected = reference.paged_attention(*case.upcast().args()).float()
    torch.testing.assert_close(cpu.paged_attention(*case.args()), expected, atol=2e-6, rtol=2e-6)


def _scatter(k: torch.Tensor, v: torch.Tensor, slots: list[int], num_blocks: int, page: int,
             dtype: torch.dtype = torch.float32):
    """A fresh NaN cache of `dtype` holding rows k/v [L, Hkv, D] at `slots`."""
    shape = (num_blocks, page, k.shape[1], k.shape[2])
    k_cache, v_cache = torch.full(shape, float("nan"), dtype=dtype), torch.full(shape, float("nan"), dtype=dtype)
    reference.write_kv(k, v, k_cache, v_cache, torch.tensor(slots))
    return k_cache, v_cache


def _attend(attention, q, k_cache, v_cache, tables, prefixes, counts, mask=None):
    starts = torch.tensor([0] + counts).cumsum(0).to(torch.int32)
    width = max(len(t) for t in tables)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    packed = None if mask is None else reference.pack_tree_mask(mask)
    return attention(q, k_cache, v_cache, table, torch.tensor(prefixes, dtype=torch.int32), starts, packed, 0.125)


def _row_three_ways(attention, seed: int, group: int = 3, prefix: int = 13, page: int = 4,
                    cache_dtype: torch.dtype = torch.float32):
    """One token's attention output computed (a) as a lone decode, (b) as a decode in a batch beside two other
    sequences, and (c) as node 5 of a 7-node tree whose path to it is root -> 2 -> 5. The kernel scores query
    heads in blocks of up to three (one KV head's queries, rows and heads alike): with `group` query heads per KV
    head other than three, the tree's row 5 falls in blocks of other sizes and offsets than the lone decode's.
    With AVX-512, a prefix of 16 keys or more scores the queries of a block of six or more (the tree's; a lone
    decode's with six query heads or more per KV head) sixteen keys at a time (keys in lanes), up to four queries
    together, and fewer queries a key at a time: a row's query falls in blocks of four at different offsets.
    With a bfloat16 cache (AMX tiles or AVX512-BF16 dot products), node 5's list is not a prefix of the tree's
    node order, so it takes its own steps past the prefix, where the lone decode shares them."""
    gen = torch.Generator().manual_seed(seed)
    kv_heads, d = 2, 64
    heads = kv_heads * group
    parents = [-1, 0, 0, 1, 2, 2, 4]
    n = len(parents)
    keys = torch.randn(prefix + n, kv_heads, d, generator=gen)
    values = torch.randn(prefix + n, kv_heads, d, generator=gen)
    queries = torch.randn(n, heads, d, generator=gen)
    path = [0, 2, 5]  # node 5's ancestors, root first: positions prefix, prefix + 1, prefix + 2 in plain decode

    # (a) plain decode of node 5: the committed prefix is the prompt and the path before it, in position order.
    seq_keys = torch.cat([keys[:prefix], keys[prefix + torch.tensor(path)]])
    seq_values = torch.cat([values[:prefix], values[prefix + torch.tensor(path)]])
    length = prefix + len(path)
    blocks = [7, 2, 9, 4, 0]  # shuffled, not contiguous
    slots = [blocks[p // page] * page + p % page for p in range(length)]
    k_cache, v_cache = _scatter(seq_keys, seq_values, slots, 12, page, cache_dtype)
    alone = _attend(attention, queries[5:6], k_cache, v_cache, [blocks], [length - 1], [1])

    # (b) the same decode beside two other sequences of other lengths (their rows first and last).
    other_k, other_v = torch.randn(30, kv_heads, d, generator=gen), torch.randn(30, kv_heads, d, generator=gen)
    big_k = torch.cat([seq_keys, other_k])
    big_v = torch.cat([seq_values, other_v])
    t1, t3 = [10, 11, 12], [13, 14, 15, 16]  # 9 and 14 (+ 1 new) tokens: different padding for a padded kernel
    other_slots = [t1[p // page] * page + p % page for p in range(10)] + [t3[p // page] * page + p % page for p in range(15)]
    k_cache, v_cache = _scatter(big_k[: length + 25], big_v[: length + 25], slots + other_slots, 17, page,
                                cache_dtype)
    q = torch.cat([torch.randn(1, heads, d, generator=gen), queries[5:6], torch.randn(1, heads, d, generator=gen)])
    batched = _attend(attention, q, k_cache, v_cache, [t1, blocks, t3], [9, length - 1, 14], [1, 1, 1])[1:2]

    # (c) node 5 of the whole tree: all 7 nodes appended after the prompt in node order, tree-masked.
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    tree_blocks = [3, 8, 1, 6, 5]
    tree_slots = [tree_blocks[p // page] * page + p % page for p in range(prefix + n)]
    k_cache, v_cache = _scatter(keys, values, tree_slots, 12, page, cache_dtype)
    tree = _attend(attention, queries, k_cache, v_cache, [tree_blocks], [prefix], [n], mask)[5:6]
    return alone, batched, tree


@pytest.mark.parametrize("seed,group,prefix,page", [(0, 3, 13, 4), (1, 3, 13, 4), (2, 3, 13, 4), (3, 3, 13, 4),
                                                     (4, 1, 13, 4), (5, 2, 13, 4), (6, 4, 13, 4), (7, 5, 13, 4),
                                                     (8, 3, 40, 16), (9, 2, 71, 16), (10, 4, 32, 16),
                                                     (11, 6, 40, 16), (12, 7, 33, 16)])
def test_attention_row_is_bit_identical_alone_batched_and_in_a_tree(seed, group, prefix, page):
    alone, batched, tree = _row_three_ways(cpu.paged_attention, seed, group, prefix, page)
    assert torch.equal(alone, batched)
    assert torch.equal(alone, tree)
    reference_alone = _row_three_ways(reference.paged_attention, seed, group, prefix, page)[0]
    torch.testing.assert_close(alone, reference_alone, atol=2e-6, rtol=2e-6)  # and it is the right answer


bf16_attention = pytest.mark.skipif(not (cpu.available() and cpu.bf16_attention()),
                                    reason="no AMX-BF16 or AVX512-BF16 here: a bfloat16 K/V cache takes the torch "
                                    "reference")


def _bf16_reference(q, k_cache, v_cache, *rest):
    """What the tiles compute, up to their rounding of the weights: q rounded as K is, float64 from there."""
    return reference.paged_attention(q.bfloat16().double(), k_cache.double(), v_cache.double(), *rest).float()


@contextlib.contextmanager
def _bf16_kernel(level: str):
    """The kernels held to `level` ("amx": the AMX tiles' bfloat16 attention; "avx512": the AVX512-BF16 dot
    products, which a CPU with both runs only when held there); skips where the CPU lacks it."""
    before = cpu.isa()
    try:
        if cpu.isa(level) != level or not cpu.bf16_attention():
            pytest.skip(f"no bfloat16 attention at the {level} level here")
        yield
    finally:
        cpu.isa(before)


@bf16_attention
@pytest.mark.parametrize("level", ["amx", "avx512"])
@pytest.mark.parametrize("seed,group,prefix,page", [(0, 3, 13, 4), (1, 3, 13, 4), (4, 1, 13, 4), (6, 4, 13, 4),
                                                     (7, 5, 13, 4), (8, 3, 40, 16), (9, 2, 71, 16),
                                                     (10, 4, 32, 16), (11, 3, 29, 16), (12, 6, 61, 16)])
def test_bf16_attention_row_is_bit_identical_alone_batched_and_in_a_tree(seed, group, prefix, page, level):
    with _bf16_kernel(level):
        alone, batched, tree = _row_three_ways(cpu.paged_attention, seed, group, prefix, page, torch.bfloat16)
    assert torch.equal(alone, batched)
    assert torch.equal(alone, tree)
    expected = _row_three_ways(_bf16_reference, seed, group, prefix, page, torch.bfloat16)[0]
    torch.testing.assert_close(alone, expected, atol=1e-2, rtol=1e-2)  # the weights' rounding, no more
    assert not torch.equal(alone, expected)  # and the bits are the tiles' own, not the reference's


@bf16_attention
@pytest.mark.parametrize("level", ["amx", "avx512"])
@pytest.mark.parametrize("tree", [None, "chain", "star", "random"])
@pytest.mark.parametrize("group,head_dim", [(1, 32), (3, 64), (2, 128)])
def test_bf16_attention_matches_the_reference(make_case, tree, group, head_dim, level):
    """Prefill chunks (causal), chains and trees beside each other, over NaN-poisoned unused slots: within the
    rounding of the weights to bfloat16 (an error of a few 1e-3 on outputs of order 1)."""
    case = make_case(70 + group, [0, 11, 40, 75], [5, 9, 1, 20], kv_heads=2, group=group, head_dim=head_dim, page=4,
                     tree=tree, strided_q=tree == "random")
    k_cache, v_cache = case.k_cache.bfloat16(), case.v_cache.bfloat16()
    args = (case.q, k_cache, v_cache, *case.args()[3:])
    with _bf16_kernel(level):
        got = cpu.paged_attention(*args)
    torch.testing.assert_close(got, _bf16_reference(*args), atol=1e-2, rtol=1e-2)
    fp32 = reference.paged_attention(case.q.double(), case.k_cache.double(), case.v_cache.double(),
                                     *case.args()[3:]).float()
    assert (got - fp32).abs().max() > 1e-4  # it did round: this is not the float32 kernel under another name


def test_the_float32_reference_is_not_batch_invariant_so_the_test_above_can_fail():
    """The padded SDPA reference gives different bits for the same row in a different batch or tree."""
    differs = 0
    for seed in range(4):
        alone, batched, tree = _row_three_ways(reference.paged_attention, seed)
        differs += (not torch.equal(alone, batched)) + (not torch.equal(alone, tree))
    assert differs > 0


# ---- elementwise steps ---------------------------------------------------------------------------------------
def _close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.dtype == torch.int8:  # a float 1 ulp apart may round to the neighbouring integer
            assert (g.int() - w.int()).abs().max() <= 1
        else:
            torch.testing.assert_close(g, w, atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("mode", [FLOAT, ROWSCALE, Q8])
@pytest.mark.parametrize("residual", ["none", "plain", "scaled"])
def test_rms_norm_matches_reference(mode, residual):
    gen = torch.Generator().manual_seed(mode)
    x, w = torch.randn(5, 576, generator=gen) * 3, torch.randn(576, generator=gen)
    res = None if residual == "none" else torch.randn(5, 576, generator=gen)
    scale = torch.rand(5, 1, generator=gen) if residual == "scaled" else None
    x_ref = x.clone()
    got = cpu.rms_norm(x, w, 1e-5, mode, res, scale)
    want = reference.rms_norm(x_ref, w, 1e-5, mode, res, scale)
    torch.testing.assert_close(x, x_ref, atol=1e-6, rtol=1e-6)  # the residual update, in place
    _close(got, want)


@pytest.mark.parametrize("mode", [FLOAT, ROWSCALE, Q8])
@pytest.mark.parametrize("scaled", [False, True])
def test_silu_mul_matches_reference(mode, scaled):
    gen = torch.Generator().manual_seed(10 + mode)
    gate_up = torch.randn(4, 2 * 96, generator=gen) * 6  # both tails of silu
    scale = torch.rand(4, 1, generator=gen) + 0.5 if scaled else None
    _close(cpu.silu_mul(gate_up, scale, mode), reference.silu_mul(gate_up, scale, mode))


@pytest.mark.parametrize("mode", [ROWSCALE, Q8])
def test_quantize_is_the_reference_bit_for_bit(mode):
    x = torch.randn(6, 3, 64, generator=torch.Generator().manual_seed(3))
    x[2] = 0.0  # an all-zero row stays zero
    # A row whose scale is exactly 1 (max 127) and whose values sit halfway between integers: ties round to
    # even in the reference (torch.round), so the vectorised kernel must too.
    x[4].view(-1)[:8] = torch.tensor([127.0, 2.5, -3.5, 0.5, -0.5, 1.5, -2.5, 126.5])
    for got, want in zip(cpu.quantize(x, mode), reference.quantize(x, mode)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("scaled,biased", [(False, False), (True, False), (True, True)])
def test_rope_kv_matches_reference(scaled, biased):
    gen = torch.Generator().manual_seed(4)
    q_heads, kv_heads, d, rows = 6, 2, 64, 5
    qkv = torch.randn(rows, (q_heads + 2 * kv_heads) * d, generator=gen)
    scale = torch.rand(rows, 1, generator=gen) if scaled else None
    bias = torch.randn(qkv.shape[1], generator=gen) if biased else None
    angles = torch.rand(300, d // 2, generator=gen) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    positions, slots = torch.tensor([0, 7, 299, 31, 2]), torch.tensor([5, 0, 17, 9, 30])
    caches = [torch.zeros(4, 8, kv_heads, d) for _ in range(4)]
    got = cpu.rope_kv(qkv, scale, bias, positions, cos, sin, caches[0], caches[1], slots, q_heads, kv_heads)
    want = reference.rope_kv(qkv, scale, bias, positions, cos, sin, caches[2], caches[3], slots, q_heads, kv_heads)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(caches[0], caches[2], atol=2e-6, rtol=2e-6)
    assert torch.equal(caches[1], caches[3])  # v is copied, not computed


def test_rope_kv_into_a_bfloat16_cache_writes_the_float32_rows_rounded():
    """torch's rounding (to nearest even) of what the float32 cache gets, ties and specials included."""
    gen = torch.Generator().manual_seed(5)
    q_heads, kv_heads, d, rows = 3, 1, 32, 4
    qkv = torch.randn(rows, (q_heads + 2 * kv_heads) * d, generator=gen)
    qkv[0, -4:] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, float("inf"), -0.0])  # v: ties both ways, inf, -0
    cos, sin = torch.ones(10, d), torch.zeros(10, d)
    positions, slots = torch.tensor([1, 2, 3, 4]), torch.tensor([3, 0, 6, 5])
    k32, v32 = torch.zeros(2, 4, kv_heads, d), torch.zeros(2, 4, kv_heads, d)
    k16 = torch.zeros(2, 4, kv_heads, d, dtype=torch.bfloat16)
    v16 = torch.zeros(2, 4, kv_heads, d, dtype=torch.bfloat16)
    q32 = cpu.rope_kv(qkv, None, None, positions, cos, sin, k32, v32, slots, q_heads, kv_heads)
    q16 = cpu.rope_kv(qkv, None, None, positions, cos, sin, k16, v16, slots, q_heads, kv_heads)
    assert torch.equal(q16, q32)  # q stays float32
    assert torch.equal(k16.view(torch.int16), k32.bfloat16().view(torch.int16))
    assert torch.equal(v16.view(torch.int16), v32.bfloat16().view(torch.int16))


# ---- int8 / int4 linears ---------------------------------------------------------------------------------
def _linear_case(rows: int, k: int, n: int, seed: int):
    from specdec.models.qlinear import quantize_weight_q4
    from specdec.models.quant import quantize_weight_per_channel

    gen = torch.Generator().manual_seed(seed)
    weight, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    act = reference.quantize(torch.randn(rows, k, generator=gen), Q8)
    w8, w_scale = quantize_weight_per_channel(weight)
    w4, d, m_t = quantize_weight_q4(weight)
    return act, (reference.pack_q8(w8), w_scale), (*reference.pack_q4(w4, d), m_t), bias


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("k,n", [(64, 13), (576, 72)])
def test_linear_q8_is_the_reference_bit_for_bit(rows, k, n):
    (q, s, _), (w, w_scale), _, bias = _linear_case(rows, k, n, rows)
    assert torch.equal(cpu.linear_q8(q, s, w, w_scale, bias), reference.linear_q8(q, s, w, w_scale, bias))
    assert torch.equal(cpu.linear_q8(q, s, w, w_scale), reference.linear_q8(q, s, w, w_scale))


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 11])
@pytest.mark.parametrize("k,n", [(64, 13), (576, 72), (1536, 8)])
def test_linear_q8_with_seven_bit_weights_is_the_reference_bit_for_bit(rows, k, n):
    """Row counts cover every grouping (threes, pairs, a lone row) and their mixes; n = 13 pads the last tile.
    The 7-bit path must give what the 8-bit path gives for the same weights: it is only another way to sum."""
    from specdec.models.quant import quantize_weight_per_channel

    (q, s, _), _, _, bias = _linear_case(rows, k, n, 40 + rows)
    w7, w_scale = quantize_weight_per_channel(torch.randn(n, k, generator=torch.Generator().manual_seed(rows)), 7)
    assert int(w7.abs().max()) == 63
    w = reference.pack_q8(w7)
    want = reference.linear_q8(q, s, w, w_scale, bias, 7)
    assert torch.equal(cpu.linear_q8(q, s, w, w_scale, bias, 7), want)
    assert torch.equal(cpu.linear_q8(q, s, w, w_scale, bias), want)
    with pytest.raises(ValueError, match="-63, 63"):
        reference.linear_q8(q, s, reference.pack_q8(quantize_weight_per_channel(torch.randn(n, k))[0]), w_scale,
                            bias, 7)


def test_linear_q8_with_seven_bit_weights_is_exact_at_the_extremes():
    """Every product at its largest magnitude over a long row (8,960 inputs, Qwen's down projection): w + 64
    must neither saturate vpmaddubsw's int16 pairs nor lose the 64 * sum(q) correction."""
    k, n = 8960, 8
    q = torch.full((5, k), -127, dtype=torch.int8)
    q[1] = 127
    q[2, ::2] = 127
    q[3, 1::3] = 0
    s = torch.ones(5, 1)
    w = torch.full((n, k), 63, dtype=torch.int8)
    w[1] = -63
    w[2, 1::3] = -63
    w[3, ::2] = 0
    tiles, w_scale = reference.pack_q8(w), torch.ones(n)
    want = (q.long() @ w.long().T).float()
    assert torch.equal(cpu.linear_q8(q, s, tiles, w_scale, None, 7), want)


@pytest.mark.parametrize("rows", [1, 3, 4, 9])
@pytest.mark.parametrize("k,n", [(64, 13), (576, 72)])
def test_linear_q4_matches_reference(rows, k, n):
    (q, s, gsum), _, (w, d, m), bias = _linear_case(rows, k, n, 20 + rows)
    torch.testing.assert_close(cpu.linear_q4(q, s, gsum, w, d, m, bias), reference.linear_q4(q, s, gsum, w, d, m, bias),
                               atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("bits", [8, 7, 4])
def test_linear_rows_are_bit_identical_alone_and_batched(bits):
    """Rows go through different tiles (threes, pairs, a lone tail row) depending on the batch size."""
    (q, s, gsum), (w8, w_scale), (w4, d, m), bias = _linear_case(11, 576, 70, bits)
    if bits == 7:
        from specdec.models.quant import quantize_weight_per_channel

        w7, w_scale = quantize_weight_per_channel(reference.unpack_q8(w8, 70).float(), 7)
        w8 = reference.pack_q8(w7)

    def run(rows: slice) -> torch.Tensor:
        if bits != 4:
            return cpu.linear_q8(q[rows], s[rows], w8, w_scale, bias, bits)
        return cpu.linear_q4(q[rows], s[rows], gsum[rows], w4, d, m, bias)

    full = run(slice(None))
    alone = torch.cat([run(slice(i, i + 1)) for i in range(11)])
    assert torch.equal(full, alone)
    assert torch.equal(full[3:8], run(slice(3, 8)))


# ---- KV compaction ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("src,dst", [([5, 6, 7], [1, 2, 3]), ([1, 2, 3], [2, 3, 4]), ([9, 4], [4, 0]), ([], [])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_kv_layers_is_the_reference_in_every_layer(src, dst, dtype):
    """Overlapping moves (2 -> 3 while 3 -> 4) must copy snapshots of the sources, layer by layer; the copy moves
    bytes, so a bfloat16 cache (which the engine's dispatch sends here too) is served alike."""
    gen = torch.Generator().manual_seed(len(src))
    layers = [(torch.randn(3, 4, 2, 8, generator=gen).to(dtype), torch.randn(3, 4, 2, 8, generator=gen).to(dtype))
              for _ in range(3)]
    expected = [(k.clone(), v.clone()) for k, v in layers]
    src_t, dst_t = torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64)
    for k, v in expected:
        reference.copy_kv_slots(k, v, src_t, dst_t)
    cpu.copy_kv_layers([k for k, _ in layers], [v for _, v in layers], src_t, dst_t)
    for (k, v), (ek, ev) in zip(layers, expected):
        assert torch.equal(k, ek) and torch.equal(v, ev)
    with pytest.raises(RuntimeError, match="slot out of range"):
        cpu.copy_kv_layers([layers[0][0]], [layers[0][1]], torch.tensor([12]), torch.tensor([0]))


# ---- top-k with probabilities (Token Recycling's matrix update) ----------------------------------------------
@pytest.mark.parametrize("rows,vocab,k", [(1, 49152, 8), (9, 1000, 8), (3, 37, 5), (2, 8, 8)])
def test_top_k_probs_matches_the_reference(rows, vocab, k):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(rows, vocab, generator=gen) * 4
    logits[0, 3] = logits[0, 5] = logits[0].max() + 1  # a tie for first place: the lower index comes first
    probs, ids = cpu.top_k_probs(logits, k)
    want_probs, want_ids = reference.top_k_probs(logits, k)
    assert torch.equal(ids, want_ids)
    assert ids[0, 0] == 3 and ids[0, 1] == 5
    torch.testing.assert_close(probs, want_probs, rtol=1e-4, atol=1e-7)  # float32 sums over V in another order
    # batch invariance: a row alone gives the same bits
    alone_probs, alone_ids = cpu.top_k_probs(logits[-1:], k)
    assert torch.equal(alone_probs[0], probs[-1]) and torch.equal(alone_ids[0], ids[-1])


@pytest.mark.parametrize("rows,vocab", [(1, 49152), (5, 1000), (3, 7), (2, 8), (4, 17)])
def test_argmax_rows_is_torch_argmax_ties_included(rows, vocab):
    gen = torch.Generator().manual_seed(vocab + rows)
    logits = torch.randn(rows, vocab, generator=gen)
    top = logits.max() + 1
    logits[0, vocab // 2] = logits[0, vocab - 1] = top  # a tie: the first index wins
    if rows > 1:
        logits[1] = 0.0  # all equal: index 0
    assert torch.equal(cpu.argmax_rows(logits), reference.argmax_rows(logits))
    assert cpu.argmax_rows(logits)[0] == vocab // 2


@pytest.mark.parametrize("vocab", [7, 64, 100, 49152])
@pytest.mark.parametrize("at", [0, -1, "middle"])
def test_argmax_rows_is_minus_one_for_a_row_with_nan_or_plus_inf_and_ignores_minus_inf(vocab, at):
    """Greedy verification reads the argmax as its check of the logits (the engine makes no other pass over
    them): NaN or +Inf anywhere in a row gives -1, wherever it lies (first lane, a chain's lane, the tail);
    -Inf is a token ruled out, as processed rows hold, and leaves the argmax alone."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(4, vocab, generator=gen)
    j = vocab // 2 if at == "middle" else at
    logits[0, j] = float("nan")
    logits[1, j] = float("inf")
    logits[2, j] = -float("inf")
    want = logits[2].clone()
    got = cpu.argmax_rows(logits)
    assert got[0] == -1 and got[1] == -1
    assert got[2] == want.argmax() and got[3] == logits[3].argmax()
    assert torch.equal(got, reference.argmax_rows(logits))
