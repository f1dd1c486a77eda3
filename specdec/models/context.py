"""Attention metadata for one forward pass over the paged KV cache.

The model forward takes only token ids and positions; everything attention needs to find a token's K/V
travels in this one frozen object, built by the engine for each step (nano-vllm's lesson: it keeps the
forward signature small and makes CUDA-graph capture simple).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from specdec.kernels.reference import pack_tree_mask


@dataclass(frozen=True)
class AttentionContext:
    slot_mapping: Tensor  # [T] int64: cache slot each new token's K/V is written to
    block_tables: Tensor  # [B, max_blocks] int32
    prefix_lens: Tensor  # [B] int32: tokens already in the cache before this step's new tokens
    query_start_loc: Tensor  # [B + 1] int32: sequence b's new tokens are rows start[b]:start[b + 1]
    tree_mask: Tensor | None  # [T, W] int32 bit-packed visibility among new tokens; None = causal
    decode_only: bool  # every sequence has exactly one new token and no mask: the decode kernel applies
    seq_lens: Tensor | None = None  # [B] int32 prefix + new tokens (decode kernel input)
    workspace: dict = field(default_factory=dict)  # per-pass scratch the torch reference reuses across layers

    @staticmethod
    def build(
        block_tables: list[list[int]],
        prefix_lens: list[int],
        num_new: list[int],
        slot_mapping: list[int],
        device: torch.device,
        masks: list[Tensor | None] | None = None,
    ) -> "AttentionContext":
        """Build from plain Python lists, one entry per sequence.

        `masks[b]` is a bool `[n_b, n_b]` visibility matrix among sequence b's new tokens, or None for
        causal. When every mask is None the whole batch is causal and no mask tensor is made.
        """
        batch = len(block_tables)
        width = max((len(t) for t in block_tables), default=1) or 1
        starts = [0]
        for n in num_new:
            starts.append(starts[-1] + n)
        tree_mask = None
        if masks is not None and any(m is not None for m in masks):
            longest = max(num_new)
            dense = torch.zeros(starts[-1], longest, dtype=torch.bool)
            for b, n in enumerate(num_new):
                m = masks[b] if masks[b] is not None else torch.ones(n, n, dtype=torch.bool).tril()
                dense[starts[b] : starts[b + 1], :n] = m
            tree_mask = pack_tree_mask(dense).to(device)
        decode_only = tree_mask is None and all(n == 1 for n in num_new)
        # Every int32 field from one host list as one tensor (one copy to a GPU), views of it: built as a tensor
        # each (and a row copy per block table) it cost 80 us a step on a CPU whose caches the step's weights
        # had just flushed, and a drafter's forward builds one too.
        flat: list[int] = []
        for table in block_tables:
            flat += table
            flat += [0] * (width - len(table))
        flat += prefix_lens
        flat += starts
        if decode_only:
            flat += [p + 1 for p in prefix_lens]
        meta = torch.tensor(flat, dtype=torch.int32).to(device)
        after_tables = batch * width
        return AttentionContext(
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
            block_tables=meta[:after_tables].view(batch, width),
            prefix_lens=meta[after_tables: after_tables + batch],
            query_start_loc=meta[after_tables + batch: after_tables + 2 * batch + 1],
            tree_mask=tree_mask,
            decode_only=decode_only,
            seq_lens=meta[after_tables + 2 * batch + 1:] if decode_only else None,
        )
