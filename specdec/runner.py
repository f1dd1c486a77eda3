"""ModelRunner: one model plus its paged KV cache, and the flattening of many sequences' new tokens into one
forward pass.

The target runner and a draft model's runner are the same class: each owns a cache and runs varlen batches of
*chunks* (a prefill slice, one decode token, or a whole tree) in one call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.kvcache import BlockTable, PagedKVCache
from specdec.models.context import AttentionContext
from specdec.models.llama import LlamaModel


@dataclass
class Chunk:
    """New tokens of one sequence for one forward pass."""

    table: BlockTable  # the sequence's block table; the chunk's slots are appended to it
    tokens: list[int]
    positions: list[int]  # absolute positions (prefix + depth for tree nodes)
    mask: Tensor | None = None  # [n, n] bool visibility among the new tokens; None = causal
    logits: str = "all"  # which rows need logits: "all", "last" or "none"


@dataclass
class ChunkOutput:
    logits: Tensor | None  # [rows, V] float32 (rows: n for "all", 1 for "last")
    hidden: Tensor | None  # [n, H] final hidden states, or [n, L*H] captured layer inputs, when asked for
    prefix_len: int  # cache length before this chunk was appended


class ModelRunner:
    def __init__(self, model: LlamaModel, cache: PagedKVCache, num_layers: int | None = None) -> None:
        self.model = model
        self.cache = cache
        self.num_layers = num_layers  # run only the first layers (an early-exit draft over the target)
        self.device = model.device

    @staticmethod
    def create(model: LlamaModel, num_blocks: int, block_size: int, num_layers: int | None = None,
               prefix_caching: bool = False) -> "ModelRunner":
        c = model.config
        cache = PagedKVCache(num_layers or c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim,
                             dtype=model.kv_cache_dtype, device=model.device,
                             prefix_caching=prefix_caching)
        return ModelRunner(model, cache, num_layers)

    @torch.inference_mode()
    def run(self, chunks: list[Chunk], return_hidden: bool = False,
            capture_layers: tuple[int, ...] = ()) -> list[ChunkOutput]:
        """Append every chunk's slots, run one forward, split the outputs back per chunk.

        With `return_hidden`, each output carries features for a feature drafter: the final-norm hidden states,
        or, when `capture_layers` names layers (EAGLE-3), the residual streams entering them, concatenated.
        The caller must have checked that the cache has room (`cache.can_append`).
        """
        tables, prefixes, counts, slots, tokens, positions, masks = [], [], [], [], [], [], []
        for chunk in chunks:
            prefixes.append(chunk.table.length)
            new_slots = self.cache.append(chunk.table, len(chunk.tokens))
            if new_slots is None:
                raise RuntimeError("KV cache has no room for a scheduled chunk (the scheduler should prevent this)")
            tables.append(chunk.table.blocks)
            counts.append(len(chunk.tokens))
            slots.extend(new_slots)
            tokens.extend(chunk.tokens)
            positions.extend(chunk.positions)
            masks.append(chunk.mask)
        device = self.device
        ctx = AttentionContext.build(tables, prefixes, counts, slots, device, masks)
        rows, starts = [], [0]
        for chunk, n in zip(chunks, counts):
            if chunk.logits == "all":
                rows.extend(range(starts[-1], starts[-1] + n))
            elif chunk.logits == "last":
                rows.append(starts[-1] + n - 1)
            starts.append(starts[-1] + n)
        out = self.model(
            torch.tensor(tokens, dtype=torch.int64, device=device),
            torch.tensor(positions, dtype=torch.int64, device=device),
            ctx,
            self.cache.layers,
            logits_rows=torch.tensor(rows, dtype=torch.int64, device=device),
            return_hidden=return_hidden and not capture_layers,
            capture_layers=capture_layers if return_hidden else (),
            num_layers=self.num_layers,
        )
        features = out.hidden
        if return_hidden and capture_layers:
            features = torch.cat([out.layer_inputs[i] for i in capture_layers], dim=-1)
        results, row = [], 0
        for b, chunk in enumerate(chunks):
            n_rows = {"all": counts[b], "last": 1, "none": 0}[chunk.logits]
            logits = out.logits[row: row + n_rows] if n_rows else None
            hidden = features[starts[b]: starts[b + 1]] if features is not None else None
            results.append(ChunkOutput(logits, hidden, prefixes[b]))
            row += n_rows
        return results

    def commit_path(self, table: BlockTable, prefix_len: int, accepted_nodes: list[int]) -> None:
        """Keep only the accepted tree path: compact its K/V to follow the prefix, drop everything else."""
        src = [table.slot(prefix_len + node, self.cache.block_size) for k, node in enumerate(accepted_nodes) if node != k]
        dst = [table.slot(prefix_len + k, self.cache.block_size) for k, node in enumerate(accepted_nodes) if node != k]
        self.cache.copy_slots(src, dst)
        self.cache.truncate(table, prefix_len + len(accepted_nodes))
