"""The paged KV cache against a dense reference.

The cache must behave, for every sequence, exactly like a plain list of K/V rows: appending reserves rows,
truncating drops them, copying moves rows, forking duplicates the list (sharing storage until one side writes),
freeing forgets it. The randomized test drives many sequences over a small pool and checks, after every
operation, both the pool's bookkeeping and every live sequence's K/V against that dense model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch

from specdec.kernels.reference import write_kv
from specdec.kvcache.paged_cache import BlockTable, PagedKVCache

BLOCK_SIZE = 4
NUM_BLOCKS = 24
NUM_LAYERS = 2
KV_HEADS = 2
HEAD_DIM = 8


def make_cache(num_blocks: int = NUM_BLOCKS) -> PagedKVCache:
    return PagedKVCache(NUM_LAYERS, num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)


def random_rows(n: int, gen: torch.Generator) -> torch.Tensor:
    """K/V for `n` tokens in every layer: `[n, layers, 2 (k, v), kv_heads, head_dim]`."""
    return torch.randn(n, NUM_LAYERS, 2, KV_HEADS, HEAD_DIM, generator=gen)


def write_rows(cache: PagedKVCache, slots: list[int], rows: torch.Tensor) -> None:
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    for layer, (k_cache, v_cache) in enumerate(cache.layers):
        write_kv(rows[:, layer, 0], rows[:, layer, 1], k_cache, v_cache, slot_mapping)


def dense_kv(cache: PagedKVCache, table: BlockTable) -> torch.Tensor:
    """What the cache holds for a sequence, in the same layout as `random_rows`."""
    if table.length == 0:
        return torch.empty(0, NUM_LAYERS, 2, KV_HEADS, HEAD_DIM)
    per_layer = [torch.stack(cache.gather(table, layer), dim=1) for layer in range(NUM_LAYERS)]
    return torch.stack(per_layer, dim=1)


def free_list(cache: PagedKVCache) -> list[int]:
    """The pool's free list (private state, read only here: it is the only way to see a block that is both
    free and referenced)."""
    return list(cache.pool._free)


@dataclass
class Mirror:
    """One live sequence: its block table and the dense K/V rows it should read back."""

    table: BlockTable
    rows: list[torch.Tensor] = field(default_factory=list)  # each [layers, 2, kv_heads, head_dim]


def expected_new_blocks(table: BlockTable, n: int, holders: dict[int, int]) -> int:
    """Blocks an append of n must take, worked out from the tables alone (not from the cache's own helper)."""
    fresh = max(-(-(table.length + n) // BLOCK_SIZE) - len(table.blocks), 0)
    writes_into_shared = n > 0 and table.length % BLOCK_SIZE != 0 and holders[table.blocks[-1]] > 1
    return fresh + (1 if writes_into_shared else 0)


def holder_counts(seqs: dict[int, Mirror]) -> dict[int, int]:
    counts = {b: 0 for b in range(NUM_BLOCKS)}
    for mirror in seqs.values():
        for block in mirror.table.blocks:
            counts[block] += 1
    return counts


def check_invariants(cache: PagedKVCache, seqs: dict[int, Mirror], context: str) -> None:
    holders = holder_counts(seqs)
    free = free_list(cache)
    assert len(free) == len(set(free)), f"{context}: a block is in the free list twice: {free}"
    for block in range(NUM_BLOCKS):
        assert cache.pool.ref_count(block) == holders[block], (
            f"{context}: block {block} has ref count {cache.pool.ref_count(block)} but {holders[block]} tables hold it")
        assert not (block in free and holders[block] > 0), f"{context}: block {block} is free and referenced"
    used = sum(1 for b in range(NUM_BLOCKS) if holders[b] > 0)
    assert cache.num_free_blocks == len(free)
    assert cache.num_free_blocks + used == NUM_BLOCKS, f"{context}: free {cache.num_free_blocks} + used {used}"
    for sid, mirror in seqs.items():
        table = mirror.table
        assert table.length == len(mirror.rows), f"{context}: seq {sid} length"
        assert len(table.blocks) == -(-table.length // BLOCK_SIZE), f"{context}: seq {sid} keeps stray blocks"
        expected = torch.stack(mirror.rows) if mirror.rows else dense_kv(cache, BlockTable())
        actual = dense_kv(cache, table)
        assert torch.equal(actual, expected), f"{context}: seq {sid} K/V differs from the dense reference"


def snapshot(cache: PagedKVCache, seqs: dict[int, Mirror]) -> tuple:
    return (
        {sid: (list(m.table.blocks), m.table.length) for sid, m in seqs.items()},
        [cache.pool.ref_count(b) for b in range(NUM_BLOCKS)],
        sorted(free_list(cache)),
    )


class RandomWorkload:
    """Seeded random operations over several sequences, mirrored in dense Python lists."""

    MAX_SEQS = 6

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.cache = make_cache()
        self.seqs: dict[int, Mirror] = {}
        self.next_id = 0
        self.counts: dict[str, int] = {}

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def new_sequence(self) -> None:
        self.seqs[self.next_id] = Mirror(BlockTable())
        self.next_id += 1
        self.count("new")

    def append(self, sid: int) -> None:
        """Append 0..7 tokens and write fresh random K/V into them (the target pass would)."""
        mirror = self.seqs[sid]
        n = self.rng.randint(0, 7)
        need = expected_new_blocks(mirror.table, n, holder_counts(self.seqs))
        assert self.cache.blocks_needed(mirror.table, n) == need, (
            f"blocks_needed({n}) at length {mirror.table.length} says {self.cache.blocks_needed(mirror.table, n)}, "
            f"expected {need}")
        before = snapshot(self.cache, self.seqs)
        slots = self.cache.append(mirror.table, n)
        if slots is None:
            assert need > len(before[2]), f"append of {n} refused although {need} <= free {len(before[2])}"
            assert snapshot(self.cache, self.seqs) == before, "a refused append changed the cache"
            self.count("append_refused")
            return
        assert need <= len(before[2]), f"append of {n} accepted although it needs {need} > free {len(before[2])}"
        assert len(slots) == n and len(set(slots)) == n
        holders = holder_counts(self.seqs)
        for slot in slots:
            assert holders[slot // BLOCK_SIZE] == 1, "a new slot lies in a block another sequence still reads"
        rows = random_rows(n, self.gen)
        if n:
            write_rows(self.cache, slots, rows)
        mirror.rows.extend(rows.unbind(0))
        self.count("append")

    def truncate(self, sid: int) -> None:
        mirror = self.seqs[sid]
        length = self.rng.randint(0, mirror.table.length)
        self.cache.truncate(mirror.table, length)
        del mirror.rows[length:]
        self.count("truncate")

    def speculate(self, sid: int) -> None:
        """Append scratch rows for a tree, then keep an accepted path: copy it into place and truncate."""
        mirror = self.seqs[sid]
        prefix = mirror.table.length
        n = self.rng.randint(1, 7)
        before = snapshot(self.cache, self.seqs)
        slots = self.cache.append(mirror.table, n)
        if slots is None:
            assert snapshot(self.cache, self.seqs) == before, "a refused append changed the cache"
            self.count("append_refused")
            return
        scratch = random_rows(n, self.gen)
        write_rows(self.cache, slots, scratch)
        accepted = sorted(self.rng.sample(range(n), self.rng.randint(0, n)))
        moves = [(node, k) for k, node in enumerate(accepted) if node != k]
        self.cache.copy_slots(
            [mirror.table.slot(prefix + node, BLOCK_SIZE) for node, _ in moves],
            [mirror.table.slot(prefix + k, BLOCK_SIZE) for _, k in moves],
        )
        self.cache.truncate(mirror.table, prefix + len(accepted))
        mirror.rows.extend(scratch[node] for node in accepted)
        self.count("speculate")

    def copy_within(self, sid: int) -> None:
        """Copy rows from anywhere in the sequence into positions of blocks only this sequence holds."""
        mirror = self.seqs[sid]
        holders = holder_counts(self.seqs)
        writable = [p for p in range(mirror.table.length)
                    if holders[mirror.table.blocks[p // BLOCK_SIZE]] == 1]
        if not writable:
            return
        dst = self.rng.sample(writable, self.rng.randint(1, min(4, len(writable))))
        src = [self.rng.randrange(mirror.table.length) for _ in dst]
        self.cache.copy_slots([mirror.table.slot(p, BLOCK_SIZE) for p in src],
                              [mirror.table.slot(p, BLOCK_SIZE) for p in dst])
        before = list(mirror.rows)  # every source is read before any destination is written
        for s, d in zip(src, dst):
            mirror.rows[d] = before[s]
        self.count("copy")

    def fork(self, sid: int) -> None:
        if len(self.seqs) >= self.MAX_SEQS:
            return
        parent = self.seqs[sid]
        self.seqs[self.next_id] = Mirror(self.cache.fork(parent.table), list(parent.rows))
        self.next_id += 1
        self.count("fork")

    def free(self, sid: int) -> None:
        self.cache.free(self.seqs.pop(sid).table)
        self.count("free")

    def step(self) -> str:
        if not self.seqs or (len(self.seqs) < self.MAX_SEQS and self.rng.random() < 0.08):
            self.new_sequence()
            return "new"
        sid = self.rng.choice(sorted(self.seqs))
        op = self.rng.choices(["append", "truncate", "speculate", "copy", "fork", "free"],
                              weights=[10, 3, 5, 2, 3, 2])[0]
        getattr(self, {"copy": "copy_within"}.get(op, op))(sid)
        return f"{op}(seq {sid})"


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_random_operations_match_a_dense_reference_and_return_every_block(seed):
    work = RandomWorkload(seed)
    for i in range(300):
        what = work.step()
        check_invariants(work.cache, work.seqs, f"seed {seed}, op {i}: {what}")
    # the workload must actually have exercised sharing, compaction and running out of blocks
    for kind in ("append", "append_refused", "truncate", "speculate", "copy", "fork", "free"):
        assert work.counts.get(kind, 0) > 0, f"seed {seed} never did {kind}: {work.counts}"
    for sid in sorted(work.seqs):
        work.cache.free(work.seqs.pop(sid).table)
    assert work.cache.num_free_blocks == NUM_BLOCKS
    assert all(work.cache.pool.ref_count(b) == 0 for b in range(NUM_BLOCKS))
    assert sorted(free_list(work.cache)) == list(range(NUM_BLOCKS))


def filled(cache: PagedKVCache, n: int, gen: torch.Generator) -> tuple[BlockTable, torch.Tensor]:
    table = BlockTable()
    rows = random_rows(n, gen)
    slots = cache.append(table, n)
    assert slots is not None
    write_rows(cache, slots, rows)
    return table, rows


def test_append_returns_slots_of_consecutive_positions():
    cache = make_cache()
    table = BlockTable()
    first = cache.append(table, 6)
    second = cache.append(table, 3)
    assert table.length == 9 and len(table.blocks) == 3
    assert first + second == [table.slot(p, BLOCK_SIZE) for p in range(9)]


def test_truncate_frees_whole_blocks_past_the_length():
    cache = make_cache()
    table, rows = filled(cache, 10, torch.Generator().manual_seed(0))  # blocks: 4 + 4 + 2
    assert cache.num_free_blocks == NUM_BLOCKS - 3
    kept_blocks = list(table.blocks)

    cache.truncate(table, 5)  # position 4 still lives in the second block
    assert table.blocks == kept_blocks[:2] and table.length == 5
    assert cache.num_free_blocks == NUM_BLOCKS - 2
    assert cache.pool.ref_count(kept_blocks[2]) == 0

    cache.truncate(table, 4)  # exactly one full block
    assert table.blocks == kept_blocks[:1]
    assert cache.num_free_blocks == NUM_BLOCKS - 1
    assert torch.equal(dense_kv(cache, table), rows[:4])

    cache.truncate(table, 0)
    assert table.blocks == [] and cache.num_free_blocks == NUM_BLOCKS


def test_truncate_beyond_the_length_raises():
    cache = make_cache()
    table, _ = filled(cache, 3, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="cannot truncate"):
        cache.truncate(table, 4)
    assert table.length == 3


def test_blocks_needed_counts_a_copy_on_write_of_a_shared_partial_block():
    cache = make_cache()
    table, _ = filled(cache, 6, torch.Generator().manual_seed(0))  # 1.5 blocks
    assert cache.blocks_needed(table, 1) == 0
    assert cache.blocks_needed(table, 3) == 1
    child = cache.fork(table)
    # the last block is now shared: the first write into it needs a private copy first
    assert cache.blocks_needed(child, 1) == 1
    assert cache.blocks_needed(table, 1) == 1
    assert cache.blocks_needed(child, 3) == 2
    assert cache.blocks_needed(child, 0) == 0


def test_blocks_needed_has_no_copy_on_write_when_the_shared_block_is_full():
    cache = make_cache()
    table, _ = filled(cache, 8, torch.Generator().manual_seed(0))
    child = cache.fork(table)
    assert cache.blocks_needed(child, 1) == 1  # a fresh block, nothing to copy
    assert cache.blocks_needed(child, 4) == 1


def test_append_into_shared_block_is_refused_when_only_the_copy_on_write_does_not_fit():
    cache = make_cache(num_blocks=2)
    table, rows = filled(cache, 6, torch.Generator().manual_seed(0))  # both blocks used, last one partial
    child = cache.fork(table)
    assert cache.num_free_blocks == 0
    assert not cache.can_append(child, 1)
    assert cache.append(child, 1) is None
    assert child.blocks == table.blocks and child.length == 6
    assert [cache.pool.ref_count(b) for b in table.blocks] == [2, 2]


def test_writing_into_a_fork_leaves_its_sibling_unchanged():
    cache = make_cache()
    gen = torch.Generator().manual_seed(1)
    parent, rows = filled(cache, 6, gen)
    child = cache.fork(parent)

    child_rows = random_rows(3, gen)
    write_rows(cache, cache.append(child, 3), child_rows)
    parent_rows = random_rows(1, gen)
    write_rows(cache, cache.append(parent, 1), parent_rows)

    assert torch.equal(dense_kv(cache, parent), torch.cat([rows, parent_rows]))
    assert torch.equal(dense_kv(cache, child), torch.cat([rows, child_rows]))
    assert parent.blocks[0] == child.blocks[0]  # the full first block is still shared
    assert parent.blocks[1] != child.blocks[1]
    cache.free(parent)
    cache.free(child)
    assert cache.num_free_blocks == NUM_BLOCKS


@pytest.mark.parametrize("accepted", [[0], [0, 1, 2], [0, 2, 5], [0, 1, 3, 4], [0, 4, 6, 7, 9]])
def test_compaction_leaves_the_same_kv_as_writing_only_the_accepted_rows(accepted):
    """Tree rollback: scratch rows for every node, then the accepted path copied into place and the rest
    truncated, must equal a cache that only ever saw the prefix and the accepted rows, in order."""
    gen = torch.Generator().manual_seed(len(accepted))
    prefix_len, tree_size = 7, 10  # the tree straddles block boundaries
    spec = make_cache()
    table, prefix = filled(spec, prefix_len, gen)
    scratch = random_rows(tree_size, gen)
    write_rows(spec, spec.append(table, tree_size), scratch)
    moves = [(node, k) for k, node in enumerate(accepted) if node != k]
    spec.copy_slots([table.slot(prefix_len + node, BLOCK_SIZE) for node, _ in moves],
                    [table.slot(prefix_len + k, BLOCK_SIZE) for _, k in moves])
    spec.truncate(table, prefix_len + len(accepted))

    plain = make_cache()
    plain_table = BlockTable()
    write_rows(plain, plain.append(plain_table, prefix_len), prefix)
    for node in accepted:
        write_rows(plain, plain.append(plain_table, 1), scratch[node: node + 1])

    assert torch.equal(dense_kv(spec, table), dense_kv(plain, plain_table))
    assert len(table.blocks) == len(plain_table.blocks)
    assert spec.num_free_blocks == plain.num_free_blocks


def test_free_returns_every_block_of_a_sequence():
    cache = make_cache()
    table, _ = filled(cache, 13, torch.Generator().manual_seed(0))
    cache.free(table)
    assert table.length == 0 and table.blocks == []
    assert cache.num_free_blocks == NUM_BLOCKS
