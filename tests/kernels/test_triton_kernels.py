"""Every Triton kernel against its torch reference, run by the Triton interpreter on CPU (see conftest.py).

The oracle is the reference evaluated in float64 on upcast inputs; the kernels run in fp32 and fp16 (bf16 is
broken in the interpreter, so bf16 is checked on a GPU by bench/gpu_check.py). Every buffer a kernel allocates
comes from a NaN-filling allocator, and unused cache slots and block-table padding hold NaN, so an element
that is never written, or a read past a sequence's end, fails the comparison.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from specdec.kernels import reference
from specdec.kernels import triton as triton_kernels
from specdec.kernels.triton.attention import AttentionTuning, attention, choose_splits
from specdec.kernels.triton.decode_attention import decode_attention_tuned

TOLERANCE = {torch.float32: dict(atol=5e-5, rtol=1e-4), torch.float16: dict(atol=3e-3, rtol=3e-3)}
SMALL_TILES = AttentionTuning(block_m=16, block_n=16)  # many tiles and key blocks even on tiny shapes


def check_attention(case, tuning: AttentionTuning, alloc) -> None:
    """Default tuning goes through the public entry point; forced tunings through `attention` with `alloc`."""
    if tuning == AttentionTuning():
        out = triton_kernels.paged_attention(*case.args())
    else:
        out = attention(*case.args(), tuning=tuning, alloc=alloc)
    expected = reference.paged_attention(*case.upcast().args())
    assert out.dtype == case.q.dtype and out.shape == case.q.shape
    torch.testing.assert_close(out.double(), expected, **TOLERANCE[case.q.dtype])


# name: (prefix_lens, new_lens, kv_heads, group, head_dim, page, tree, tuning)
SCENARIOS = {
    "causal_varlen_gqa4": ([0, 13, 37], [17, 1, 5], 2, 4, 32, 8, None, SMALL_TILES),
    "causal_split_k": ([70, 5, 33], [9, 3, 1], 1, 4, 32, 8, None, AttentionTuning(16, 16, 3, 16)),
    "random_tree_mha": ([9, 40], [7, 12], 2, 1, 64, 16, "random", SMALL_TILES),
    "chain_gqa8": ([21, 0], [6, 9], 1, 8, 32, 4, "chain", AttentionTuning()),
    "star_gqa4_split_k": ([50, 18], [11, 4], 2, 4, 16, 8, "star", AttentionTuning(16, 16, 4, 16)),
    "random_tree_group3_dim24": ([12, 3, 30], [5, 8, 2], 3, 3, 24, 8, "random", AttentionTuning(block_n=16)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_paged_attention_matches_reference(make_case, nan_alloc, name: str, dtype: torch.dtype) -> None:
    prefixes, news, kv_heads, group, head_dim, page, tree, tuning = SCENARIOS[name]
    case = make_case(
        len(name), prefixes, news, kv_heads=kv_heads, group=group, head_dim=head_dim, page=page, dtype=dtype,
        tree=tree, strided_q=name.startswith("random"),
    )  # fmt: skip
    check_attention(case, tuning, nan_alloc)


def test_tree_of_130_nodes_spans_five_mask_words(make_case, nan_alloc) -> None:
    case = make_case(7, [20, 0], [130, 3], head_dim=16, page=16, tree="random")
    assert case.tree_mask.shape[1] == 5 and (case.tree_mask < 0).any()  # bit 31 set: the sign bit
    check_attention(case, AttentionTuning(block_m=64, block_n=64), nan_alloc)


def test_long_causal_prefill_chunk(make_case, nan_alloc) -> None:
    case = make_case(8, [0, 45], [150, 40], head_dim=16, page=16, group=2)
    check_attention(case, AttentionTuning(block_m=32, block_n=32), nan_alloc)


def test_wrong_mask_is_detected(make_case) -> None:
    """The comparison can fail: a kernel fed a different mask than the reference disagrees with it."""
    case = make_case(9, [5], [6], head_dim=16, tree="random")
    causal = attention(*case.args()[:-2], None, case.scale)
    assert not torch.allclose(causal.double(), reference.paged_attention(*case.upcast().args()), atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_decode_matches_reference(make_case, dtype: torch.dtype) -> None:
    case = make_case(10, [0, 16, 40, 7], [1, 1, 1, 1], kv_heads=2, group=4, page=8, dtype=dtype)
    seq_lens = case.prefix_lens + 1
    out = triton_kernels.decode_attention(case.q, case.k_cache, case.v_cache, case.block_tables, seq_lens, 0.2)
    wide = case.upcast()
    expected = reference.decode_attention(wide.q, wide.k_cache, wide.v_cache, case.block_tables, seq_lens, 0.2)
    torch.testing.assert_close(out.double(), expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_split_k_forced(make_case, nan_alloc, group: int) -> None:
    """Split-K with more splits than short sequences can use: empty splits must contribute nothing."""
    case = make_case(11 + group, [0, 16, 69, 32], [1, 1, 1, 1], group=group, page=8)
    seq_lens = case.prefix_lens + 1
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, seq_lens, case.scale)
    out = decode_attention_tuned(*args, AttentionTuning(16, 16, num_splits=4, min_chunk=16), alloc=nan_alloc)
    wide = case.upcast()
    expected = reference.decode_attention(wide.q, wide.k_cache, wide.v_cache, case.block_tables, seq_lens, wide.scale)
    torch.testing.assert_close(out.double(), expected, **TOLERANCE[torch.float32])


def test_split_count_follows_context_and_parallelism() -> None:
    assert choose_splits(base_programs=8, max_context=32768, min_chunk=256, num_sms=132) == 64
    assert choose_splits(base_programs=8, max_context=1024, min_chunk=256, num_sms=132) == 4
    assert choose_splits(base_programs=320, max_context=32768, min_chunk=256, num_sms=132) == 2
    assert choose_splits(base_programs=4096, max_context=32768, min_chunk=256, num_sms=132) == 1


def random_cache(gen: torch.Generator, dtype: torch.dtype, blocks: int = 6, page: int = 4) -> torch.Tensor:
    return torch.randn(blocks, page, 3, 16, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_write_kv_matches_reference(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(12)
    k_cache, v_cache = random_cache(gen, dtype), random_cache(gen, dtype)
    fused = torch.randn(5, 3 * 3, 16, generator=gen)  # fp32 K/V as strided slices of a fused projection
    k, v = fused[:, 3:6], fused[:, 6:9]
    slots = torch.randperm(24, generator=gen)[:5]
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    reference.write_kv(k, v, expected_k, expected_v, slots)
    triton_kernels.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize(
    "src, dst",
    [([5, 6, 7, 8], [3, 4, 5, 6]), ([3, 4, 5, 6], [5, 6, 7, 8]), ([1, 2, 9], [2, 1, 20]), ([], [])],
    ids=["shift_down", "shift_up", "swap", "empty"],
)
def test_copy_kv_slots_reads_sources_before_writing(src: list[int], dst: list[int]) -> None:
    gen = torch.Generator().manual_seed(13)
    k_cache, v_cache = random_cache(gen, torch.float16), random_cache(gen, torch.float16)
    src_t, dst_t = torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    reference.copy_kv_slots(expected_k, expected_v, src_t, dst_t)
    triton_kernels.copy_kv_slots(k_cache, v_cache, src_t, dst_t)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("name", triton_kernels.__all__)
def test_signatures_match_reference(name: str) -> None:
    """Same parameters in the same order; the reference may add optional reference-only ones at the end."""
    ours = list(inspect.signature(getattr(triton_kernels, name)).parameters.values())
    theirs = list(inspect.signature(getattr(reference, name)).parameters.values())
    assert [p.name for p in ours] == [p.name for p in theirs[: len(ours)]]
    assert all(p.default is not inspect.Parameter.empty for p in theirs[len(ours) :])
