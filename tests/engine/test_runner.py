"""The model runner: `pack` builds one pass's attention metadata, a chunk asks for just the logits rows it reads,
`run` splits one batched forward back per chunk exactly as separate forwards would give, and `commit_path`
leaves the K/V a plain decode of the accepted tokens would leave."""

from __future__ import annotations

import pytest
import torch

from specdec.engine.runner import Chunk, ModelRunner, Rows, pack
from specdec.errors import OutOfBlocksError
from specdec.kernels.reference import unpack_tree_mask
from specdec.kvcache import BlockTable, PagedKVCache
from specdec.tree.token_tree import TokenTree
from tests.helpers import tiny_model

BS = 4
CPU = torch.device("cpu")
# root 0; 1, 2 its children; 3 under 1; 4 under 2
TREE = TokenTree.from_parents([5, 6, 7, 8, 9], [-1, 0, 0, 1, 2])


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=7, vocab=32)


def cache(num_blocks: int = 16) -> PagedKVCache:
    return PagedKVCache(1, num_blocks, BS, kv_heads=1, head_dim=2)


def filled(c: PagedKVCache, n: int) -> BlockTable:
    table = BlockTable()
    assert c.append(table, n) is not None
    return table


# --------------------------------------------------------------------------------------------------- pack
def test_pack_appends_slots_and_records_where_each_chunk_starts():
    c = cache()
    a, b = filled(c, 3), filled(c, 6)
    packed = pack(c, [Chunk(a, [1, 2], [3, 4]), Chunk(b, [3, 4, 5], [6, 7, 8])], CPU)
    assert a.length == 5 and b.length == 9
    assert packed.prefixes == [3, 6]
    assert packed.starts == [0, 2, 5]
    assert packed.tokens.tolist() == [1, 2, 3, 4, 5] and packed.positions.tolist() == [3, 4, 6, 7, 8]
    ctx = packed.ctx
    want_slots = [a.slot(p, BS) for p in (3, 4)] + [b.slot(p, BS) for p in (6, 7, 8)]
    assert ctx.slot_mapping.tolist() == want_slots
    assert ctx.prefix_lens.tolist() == [3, 6]
    assert ctx.query_start_loc.tolist() == [0, 2, 5]
    assert ctx.block_tables.shape == (2, 3)
    assert ctx.block_tables[0, : len(a.blocks)].tolist() == a.blocks
    assert ctx.block_tables[1].tolist() == b.blocks
    assert ctx.tree_mask is None and not ctx.decode_only  # causal chunks need no mask


def test_pack_of_single_tokens_is_a_decode_only_pass():
    c = cache()
    a, b = filled(c, 5), filled(c, 2)
    ctx = pack(c, [Chunk(a, [1], [5]), Chunk(b, [2], [2])], CPU).ctx
    assert ctx.decode_only and ctx.tree_mask is None
    assert ctx.seq_lens.tolist() == [6, 3]  # prefix + the new token


def test_pack_of_a_tree_beside_a_causal_chunk_masks_each_by_its_own_rule():
    c = cache()
    a, b = filled(c, 2), filled(c, 7)
    chunks = [Chunk(a, [1, 2, 3], [2, 3, 4]), Chunk(b, TREE.token_list, TREE.positions(7).tolist(), TREE.ancestor_mask)]
    packed = pack(c, chunks, CPU)
    ctx = packed.ctx
    assert ctx.tree_mask is not None and not ctx.decode_only
    dense = unpack_tree_mask(ctx.tree_mask, len(TREE))  # [T, longest chunk]
    assert dense[:3, :3].tolist() == torch.ones(3, 3, dtype=torch.bool).tril().tolist()  # causal
    assert not dense[:3, 3:].any()
    assert dense[3:].tolist() == TREE.ancestor_mask.tolist()
    assert packed.positions[3:].tolist() == [7, 8, 8, 9, 9]  # prefix + depth


def test_pack_without_room_is_a_clear_error():
    c = cache(num_blocks=1)
    with pytest.raises(OutOfBlocksError, match="kv_cache_tokens"):
        pack(c, [Chunk(BlockTable(), list(range(5)), list(range(5)))], CPU)


# ------------------------------------------------------------------------------------------------ chunks
def test_chunk_logit_rows_follow_rows_and_tail():
    tokens, positions = [1, 2, 3, 4], [0, 1, 2, 3]
    assert Chunk(BlockTable(), tokens, positions, logits=Rows.ALL).num_logit_rows == 4
    assert Chunk(BlockTable(), tokens, positions, logits=Rows.LAST).num_logit_rows == 1
    assert Chunk(BlockTable(), tokens, positions, logits=Rows.LAST, tail=3).num_logit_rows == 3
    assert Chunk(BlockTable(), tokens, positions, logits=Rows.LAST, tail=9).num_logit_rows == 4
    assert Chunk(BlockTable(), tokens, positions, logits=Rows.NONE).num_logit_rows == 0
    chunk = Chunk(BlockTable(), tokens, positions, logits="last")  # names still accepted
    assert chunk.logits is Rows.LAST


# -------------------------------------------------------------------------------------------------- run
def prefilled(runner: ModelRunner, tokens: list[int]) -> BlockTable:
    table = BlockTable()
    runner.run([Chunk(table, tokens, list(range(len(tokens))), None, Rows.NONE)])
    return table


def test_run_splits_one_batched_forward_as_separate_forwards_would_give(model):
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 11, 12, 13]]
    batched = ModelRunner.create(model, num_blocks=32, block_size=BS)
    tables = [prefilled(batched, p) for p in prompts]

    def chunks(tables):
        return [
            Chunk(tables[0], [14, 15, 16], [5, 6, 7], None, Rows.ALL),
            Chunk(tables[1], TREE.token_list, TREE.positions(2).tolist(), TREE.ancestor_mask, Rows.LAST, tail=2),
            Chunk(tables[2], [17, 18], [6, 7], None, Rows.NONE),
        ]

    outs = batched.run(chunks(tables), return_hidden=True)
    assert [o.prefix_len for o in outs] == [5, 2, 6]
    assert [None if o.logits is None else o.logits.shape[0] for o in outs] == [3, 2, None]
    for b, chunk in enumerate(chunks(tables)):
        alone = ModelRunner.create(model, num_blocks=32, block_size=BS)
        table = prefilled(alone, prompts[b])
        chunk.table = table
        (want,) = alone.run([Chunk(table, chunk.tokens, chunk.positions, chunk.mask, Rows.ALL)], return_hidden=True)
        torch.testing.assert_close(outs[b].hidden, want.hidden, atol=1e-5, rtol=1e-5)
        if outs[b].logits is not None:
            torch.testing.assert_close(outs[b].logits, want.logits[-outs[b].logits.shape[0]:], atol=1e-5, rtol=1e-5)


def test_run_returns_captured_layer_inputs_per_chunk(model):
    runner = ModelRunner.create(model, num_blocks=32, block_size=BS)
    a, b = BlockTable(), BlockTable()
    outs = runner.run([Chunk(a, [1, 2, 3], [0, 1, 2]), Chunk(b, [4, 5], [0, 1])], return_hidden=True,
                      capture_layers=(1, 0))
    hidden = model.config.hidden_size
    assert [o.hidden.shape for o in outs] == [(3, 2 * hidden), (2, 2 * hidden)]
    again = ModelRunner.create(model, num_blocks=32, block_size=BS)
    (alone,) = again.run([Chunk(BlockTable(), [4, 5], [0, 1])], return_hidden=True, capture_layers=(1, 0))
    torch.testing.assert_close(outs[1].hidden, alone.hidden, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------ commit_path
@pytest.mark.parametrize("path", [[0], [0, 1], [0, 1, 3], [0, 2, 4]], ids=["root", "in-place", "one-moved", "both-moved"])
def test_commit_path_compacts_to_what_a_plain_decode_leaves(model, path):
    prompt = [3, 1, 4, 1, 5, 9]  # the tree starts in the second block, and its path crosses into the third
    runner = ModelRunner.create(model, num_blocks=16, block_size=BS)
    table = prefilled(runner, prompt)
    prefix = table.length
    runner.run([Chunk(table, TREE.token_list, TREE.positions(prefix).tolist(), TREE.ancestor_mask, Rows.ALL)])
    runner.commit_path(table, prefix, path)
    assert table.length == prefix + len(path)
    plain = ModelRunner.create(model, num_blocks=16, block_size=BS)
    committed = prompt + [TREE.token_list[i] for i in path]
    plain_table = BlockTable()
    for p, token in enumerate(committed):  # one token at a time, as plain decode runs
        plain.run([Chunk(plain_table, [token], [p], None, Rows.LAST)])
    for layer in range(model.config.num_layers):
        for got, want in zip(runner.cache.gather(table, layer), plain.cache.gather(plain_table, layer)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert len(table.blocks) == -(-table.length // BS)  # blocks past the path went back to the pool
    runner.cache.free(table)
    assert runner.cache.num_free_blocks == runner.cache.pool.num_blocks
