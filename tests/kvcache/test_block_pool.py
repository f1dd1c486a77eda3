"""The block pool: allocation, sharing and release, with the free count as the bookkeeping everyone relies on."""

from __future__ import annotations

import pytest

from specdec.kvcache.block_pool import BlockPool


def test_new_pool_has_every_block_free_and_unreferenced():
    pool = BlockPool(5)
    assert pool.num_blocks == 5
    assert pool.num_free == 5
    assert all(pool.ref_count(b) == 0 for b in range(5))


def test_pool_without_blocks_is_rejected():
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(0)


def test_allocate_returns_distinct_blocks_each_with_one_reference():
    pool = BlockPool(6)
    blocks = pool.allocate(4)
    assert blocks is not None and len(blocks) == 4
    assert len(set(blocks)) == 4
    assert all(0 <= b < 6 for b in blocks)
    assert [pool.ref_count(b) for b in blocks] == [1, 1, 1, 1]
    assert pool.num_free == 2


def test_successive_allocations_never_hand_out_a_block_twice():
    pool = BlockPool(6)
    first, second = pool.allocate(3), pool.allocate(3)
    assert set(first).isdisjoint(second)
    assert pool.num_free == 0


def test_allocating_zero_blocks_takes_nothing():
    pool = BlockPool(3)
    assert pool.allocate(0) == []
    assert pool.num_free == 3


def test_allocation_that_does_not_fit_returns_none_and_takes_nothing():
    pool = BlockPool(4)
    held = pool.allocate(3)
    assert pool.allocate(2) is None
    assert pool.num_free == 1
    free_block = next(b for b in range(4) if b not in held)
    assert pool.ref_count(free_block) == 0
    assert [pool.ref_count(b) for b in held] == [1, 1, 1]
    # the remaining block is still obtainable: the failed call reserved nothing
    assert pool.allocate(1) == [free_block]


def test_allocating_exactly_the_free_blocks_succeeds():
    pool = BlockPool(4)
    assert pool.allocate(4) is not None
    assert pool.num_free == 0
    assert pool.allocate(1) is None


def test_release_of_last_reference_frees_the_block():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.release(block)
    assert pool.ref_count(block) == 0
    assert pool.num_free == 2


def test_released_block_can_be_allocated_again():
    pool = BlockPool(1)
    (block,) = pool.allocate(1)
    pool.release(block)
    assert pool.allocate(1) == [block]
    assert pool.ref_count(block) == 1


def test_shared_block_stays_in_use_until_every_reference_is_released():
    pool = BlockPool(3)
    (block,) = pool.allocate(1)
    pool.share(block)
    pool.share(block)
    assert pool.ref_count(block) == 3
    assert pool.num_free == 2
    pool.release(block)
    pool.release(block)
    assert pool.ref_count(block) == 1
    assert pool.num_free == 2
    assert block not in (pool.allocate(2) or [])
    pool.release(block)
    assert pool.ref_count(block) == 0
    assert pool.num_free == 1


def test_sharing_a_free_block_raises():
    pool = BlockPool(2)
    with pytest.raises(RuntimeError, match="free"):
        pool.share(0)
    assert pool.ref_count(0) == 0
    assert pool.num_free == 2


def test_double_release_raises_and_does_not_free_the_block_twice():
    pool = BlockPool(3)
    (block,) = pool.allocate(1)
    pool.release(block)
    with pytest.raises(RuntimeError, match="released twice"):
        pool.release(block)
    assert pool.num_free == 3
    # the block must appear only once in the free list: allocating everything gives distinct blocks
    everything = pool.allocate(3)
    assert sorted(everything) == [0, 1, 2]
    assert pool.allocate(1) is None


def test_releasing_a_never_allocated_block_raises():
    pool = BlockPool(2)
    with pytest.raises(RuntimeError):
        pool.release(1)
    assert pool.num_free == 2


def test_free_count_matches_reference_counts_through_mixed_operations():
    pool = BlockPool(8)
    a = pool.allocate(3)
    b = pool.allocate(2)
    pool.share(a[0])
    pool.share(b[1])
    pool.release(a[1])
    pool.release(a[0])
    assert pool.allocate(10) is None
    in_use = [blk for blk in range(8) if pool.ref_count(blk) > 0]
    assert pool.num_free + len(in_use) == 8
    assert sorted(in_use) == sorted([a[0], a[2], b[0], b[1]])
    assert pool.ref_count(a[0]) == 1 and pool.ref_count(b[1]) == 2
