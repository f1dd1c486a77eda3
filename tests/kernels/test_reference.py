"""The torch reference kernels are what every Triton kernel is judged by, so they are checked here against
attention written out independently: dense K/V gathered position by position, a float mask decoded bit by bit
with Python integers, and a softmax by hand, all in float64."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from specdec.kernels import reference


def dense_attention(case) -> Tensor:
    """Attention of `case` (float64), sharing no code with `reference.paged_attention`."""
    q, k_cache, v_cache = case.q.double(), case.k_cache.double(), case.v_cache.double()
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // kv_heads
    out = torch.zeros_like(q)
    starts = case.query_start_loc.tolist()
    for b, prefix in enumerate(case.prefix_lens.tolist()):
        n = starts[b + 1] - starts[b]
        rows = [case.block_tables[b, p // page].item() for p in range(prefix + n)]
        keys = torch.stack([k_cache[blk, p % page] for p, blk in enumerate(rows)])  # [L, Hkv, D]
        values = torch.stack([v_cache[blk, p % page] for p, blk in enumerate(rows)])
        bias = torch.zeros(n, prefix + n, dtype=torch.float64)
        for i in range(n):
            for j in range(n):
                if case.tree_mask is None:
                    visible = j <= i
                else:
                    word = int(case.tree_mask[starts[b] + i, j // 32]) & 0xFFFFFFFF
                    visible = (word >> (j % 32)) & 1 == 1
                bias[i, prefix + j] = 0.0 if visible else float("-inf")
        for h in range(q.shape[1]):
            scores = q[starts[b] : starts[b + 1], h] @ keys[:, h // group].T * case.scale + bias
            weights = torch.exp(scores - scores.max(dim=1, keepdim=True).values)
            weights = weights / weights.sum(dim=1, keepdim=True)
            out[starts[b] : starts[b + 1], h] = weights @ values[:, h // group]
    return out


@pytest.mark.parametrize("tree", [None, "chain", "star", "random"])
@pytest.mark.parametrize("group", [1, 4])
def test_paged_reference_equals_dense_attention(make_case, tree: str | None, group: int) -> None:
    case = make_case(20 + group, [0, 11, 26], [5, 9, 1], kv_heads=2, group=group, head_dim=16, page=4, tree=tree)
    paged = reference.paged_attention(*case.upcast().args())
    torch.testing.assert_close(paged, dense_attention(case), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("tree", [None, "random"])
def test_mixed_prefill_and_decode_batches_split_into_groups(make_case, tree: str | None) -> None:
    """Two long chunks (> DECODE_LIKE new tokens) among short ones: attention runs per group, same answer."""
    case = make_case(41, [0, 9, 3, 30, 0], [1, 20, 4, 1, 33], kv_heads=2, group=2, head_dim=16, page=4, tree=tree)
    workspace: dict = {}
    paged = reference.paged_attention(*case.upcast().args(), workspace=workspace)
    assert len(workspace["groups"]) == 4  # one-token decodes, the 4-token tree, each long chunk
    torch.testing.assert_close(paged, dense_attention(case), atol=1e-10, rtol=1e-10)


def test_decode_reference_equals_dense_attention(make_case) -> None:
    case = make_case(30, [0, 7, 19], [1, 1, 1], kv_heads=1, group=4, head_dim=16, page=4)
    wide = case.upcast()
    decoded = reference.decode_attention(
        wide.q, wide.k_cache, wide.v_cache, case.block_tables, case.prefix_lens + 1, case.scale
    )
    torch.testing.assert_close(decoded, dense_attention(case), atol=1e-10, rtol=1e-10)


def test_wrong_mask_gives_a_different_answer(make_case) -> None:
    """The comparison above can fail: the same case under a causal mask instead of its tree mask differs."""
    case = make_case(31, [3], [8], head_dim=16, page=4, tree="star")
    as_tree = reference.paged_attention(*case.upcast().args())
    as_causal = reference.paged_attention(*case.upcast().args()[:-2], None, case.scale)
    assert not torch.allclose(as_tree, as_causal, atol=1e-3)
    torch.testing.assert_close(as_tree, dense_attention(case), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("n", [1, 31, 32, 33, 130])
def test_pack_unpack_round_trip(n: int) -> None:
    mask = torch.rand(7, n, generator=torch.Generator().manual_seed(n)) < 0.5
    packed = reference.pack_tree_mask(mask)
    assert packed.dtype == torch.int32 and packed.shape == (7, (n + 31) // 32)
    assert torch.equal(reference.unpack_tree_mask(packed, n), mask)


def test_pack_puts_bit_j_in_word_j_div_32() -> None:
    mask = torch.zeros(3, 64, dtype=torch.bool)
    mask[0, 0] = mask[1, 31] = mask[2, 33] = True
    assert reference.pack_tree_mask(mask).tolist() == [[1, 0], [-(2**31), 0], [0, 2]]


def test_write_kv_scatters_into_slots_and_casts() -> None:
    gen = torch.Generator().manual_seed(32)
    k_cache = torch.randn(3, 4, 2, 8, generator=gen).half()
    v_cache = torch.randn(3, 4, 2, 8, generator=gen).half()
    before_k, before_v = k_cache.clone(), v_cache.clone()
    k, v = torch.randn(2, 2, 8, generator=gen), torch.randn(2, 2, 8, generator=gen)
    reference.write_kv(k, v, k_cache, v_cache, torch.tensor([9, 2]))
    assert torch.equal(k_cache[2, 1], k[0].half()) and torch.equal(v_cache[0, 2], v[1].half())
    untouched = torch.ones(3, 4, dtype=torch.bool)
    untouched[2, 1] = untouched[0, 2] = False
    assert torch.equal(k_cache[untouched], before_k[untouched]) and torch.equal(v_cache[untouched], before_v[untouched])


@pytest.mark.parametrize("src, dst", [([0, 1, 2], [1, 2, 3]), ([1, 2, 3], [0, 1, 2]), ([4, 6], [6, 4])])
def test_copy_kv_slots_moves_a_snapshot_of_the_sources(src: list[int], dst: list[int]) -> None:
    """Overlapping moves copy the old rows, not rows already overwritten in the same call."""
    gen = torch.Generator().manual_seed(33)
    k_cache, v_cache = torch.randn(2, 4, 1, 8, generator=gen), torch.randn(2, 4, 1, 8, generator=gen)
    old_k, old_v = k_cache.view(8, 1, 8).clone(), v_cache.view(8, 1, 8).clone()
    reference.copy_kv_slots(k_cache, v_cache, torch.tensor(src), torch.tensor(dst))
    expected_k, expected_v = old_k.clone(), old_v.clone()
    for s, d in zip(src, dst):
        expected_k[d], expected_v[d] = old_k[s], old_v[s]
    assert torch.equal(k_cache.view(8, 1, 8), expected_k) and torch.equal(v_cache.view(8, 1, 8), expected_v)
