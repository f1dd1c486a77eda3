"""AttentionContext.build: every field from its lists, padded block tables, the decode-only inputs, the tree mask."""

from __future__ import annotations

import torch

from specdec.kernels.reference import pack_tree_mask
from specdec.models.context import AttentionContext


def test_fields_come_from_the_lists_with_tables_padded_by_zeros():
    ctx = AttentionContext.build([[4, 7, 9], [2]], [40, 3], [2, 3], [73, 74, 35, 36, 37], torch.device("cpu"))
    assert ctx.block_tables.tolist() == [[4, 7, 9], [2, 0, 0]] and ctx.block_tables.dtype == torch.int32
    assert ctx.prefix_lens.tolist() == [40, 3] and ctx.prefix_lens.dtype == torch.int32
    assert ctx.query_start_loc.tolist() == [0, 2, 5] and ctx.query_start_loc.dtype == torch.int32
    assert ctx.slot_mapping.tolist() == [73, 74, 35, 36, 37] and ctx.slot_mapping.dtype == torch.int64
    assert ctx.tree_mask is None and not ctx.decode_only and ctx.seq_lens is None
    for field in (ctx.block_tables, ctx.prefix_lens, ctx.query_start_loc):  # what the kernels take
        assert field.is_contiguous()


def test_one_new_token_each_is_decode_only_with_sequence_lengths():
    ctx = AttentionContext.build([[1], [2, 3]], [5, 20], [1, 1], [21, 52], torch.device("cpu"))
    assert ctx.decode_only and ctx.seq_lens.tolist() == [6, 21] and ctx.query_start_loc.tolist() == [0, 1, 2]


def test_masks_pack_into_one_tree_mask_causal_where_none_is_given():
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    ctx = AttentionContext.build([[0], [1]], [3, 8], [3, 2], [3, 4, 5, 24, 25], torch.device("cpu"), [tree, None])
    dense = torch.zeros(5, 3, dtype=torch.bool)
    dense[:3] = tree
    dense[3:, :2] = torch.ones(2, 2, dtype=torch.bool).tril()
    assert torch.equal(ctx.tree_mask, pack_tree_mask(dense)) and not ctx.decode_only and ctx.seq_lens is None


def test_an_empty_batch_builds():
    ctx = AttentionContext.build([], [], [], [], torch.device("cpu"))
    assert ctx.block_tables.shape == (0, 1) and ctx.query_start_loc.tolist() == [0] and ctx.decode_only
