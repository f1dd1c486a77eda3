"""ModelRunner: one model plus its paged KV cache, and the flattening of many sequences' new tokens into one
forward pass.

The target runner and a draft model's runner are the same class: each owns a cache and runs varlen batches of
*chunks* (a prefill slice, one decode token, or a whole tree) in one call.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.engine.cuda_graphs import CudaGraphs, graphs_apply
from specdec.errors import OutOfBlocksError
from specdec.kvcache import BlockTable, PagedKVCache
from specdec.models.context import AttentionContext
from specdec.models.llama import LlamaModel


class Rows(enum.Enum):
    """Which rows of a chunk need logits (the LM head is a large share of a step: compute only what is read)."""

    ALL = "all"  # every row (a tree being verified, a draft tree's frontier)
    LAST = "last"  # the last row (the end of a prefill, a catch-up feed)
    NONE = "none"  # no row (the middle of a chunked prefill)


@dataclass
class Chunk:
    """New tokens of one sequence for one forward pass."""

    table: BlockTable  # the sequence's block table; the chunk's slots are appended to it
    tokens: list[int]
    positions: list[int]  # absolute positions (prefix + depth for tree nodes)
    mask: Tensor | None = None  # [n, n] bool visibility among the new tokens; None = causal
    logits: Rows = Rows.ALL
    tail: int = 1  # with Rows.LAST: how many of the last rows (a draft tree's newest nodes, say)

    def __post_init__(self) -> None:
        self.logits = Rows(self.logits)

    @property
    def num_logit_rows(self) -> int:
        return {Rows.ALL: len(self.tokens), Rows.LAST: min(self.tail, len(self.tokens)), Rows.NONE: 0}[self.logits]


@dataclass
class ChunkOutput:
    logits: Tensor | None  # [rows, V] float32 (rows: n for "all", 1 for "last")
    hidden: Tensor | None  # [n, H] final hidden states, or [n, L*H] captured layer inputs, when asked for
    prefix_len: int  # cache length before this chunk was appended


class ModelRunner:
    def __init__(self, model: LlamaModel, cache: PagedKVCache, num_layers: int | None = None,
                 graphs: CudaGraphs | None = None) -> None:
        self.model = model
        self.cache = cache
        self.num_layers = num_layers  # run only the first layers (an early-exit draft over the target)
        self.device = model.device
        self.graphs = graphs  # CUDA graphs of small steps (a GPU target), or None: every step eager

    @staticmethod
    def create(model: LlamaModel, num_blocks: int, block_size: int, num_layers: int | None = None,
               prefix_caching: bool = False, kv_cache_dtype: str = "auto",
               graph_tokens: int = 0) -> "ModelRunner":
        """`kv_cache_dtype`: EngineConfig's choice ("auto": the model's own, `model.kv_cache_dtype`).
        `graph_tokens`: on CUDA, steps of up to this many new tokens replay CUDA graphs (0: never)."""
        c = model.config
        graphed = graph_tokens > 0 and num_layers is None and graphs_apply(model)
        cache = PagedKVCache(num_layers or c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim,
                             dtype=model.cache_dtype(kv_cache_dtype), device=model.device,
                             prefix_caching=prefix_caching, scratch=graphed)
        graphs = CudaGraphs(model, cache, graph_tokens) if graphed else None
        return ModelRunner(model, cache, num_layers, graphs)

    @torch.inference_mode()
    def run(self, chunks: list[Chunk], return_hidden: bool = False,
            capture_layers: tuple[int, ...] = ()) -> list[ChunkOutput]:
        """Append every chunk's slots, run one forward, split the outputs back per chunk.

        With `return_hidden`, each output carries features for a feature drafter: the final-norm hidden states,
        or, when `capture_layers` names layers (EAGLE-3), the residual streams entering them, concatenated.
        The caller must have checked that the cache has room (`cache.can_append`).
        """
        packed = pack(self.cache, chunks, self.device)
        if self.graphs is not None and not return_hidden and all(c.logits is Rows.ALL for c in chunks):
            logits = self.graphs.forward(packed.tokens, packed.positions, packed.ctx)
            if logits is not None:
                return [ChunkOutput(logits[start:end], None, prefix)
                        for start, end, prefix in zip(packed.starts, packed.starts[1:], packed.prefixes)]
        rows = []
        for chunk, start, end in zip(chunks, packed.starts, packed.starts[1:]):
            rows.extend(range(end - chunk.num_logit_rows, end))
        out = self.model(
            packed.tokens,
            packed.positions,
            packed.ctx,
            self.cache.layers,
            logits_rows=torch.tensor(rows, dtype=torch.int64, device=self.device),
            return_hidden=return_hidden and not capture_layers,
            capture_layers=capture_layers if return_hidden else (),
            num_layers=self.num_layers,
        )
        features = out.hidden
        if return_hidden and capture_layers:
            features = torch.cat([out.layer_inputs[i] for i in capture_layers], dim=-1)
        results, row = [], 0
        for b, chunk in enumerate(chunks):
            n_rows = chunk.num_logit_rows
            logits = out.logits[row: row + n_rows] if n_rows else None
            hidden = features[packed.starts[b]: packed.starts[b + 1]] if features is not None else None
            results.append(ChunkOutput(logits, hidden, packed.prefixes[b]))
            row += n_rows
        return results

    def commit_path(self, table: BlockTable, prefix_len: int, accepted_nodes: list[int]) -> None:
        """Keep only the accepted tree path: compact its K/V to follow the prefix, drop everything else."""
        src = [table.slot(prefix_len + node, self.cache.block_size) for k, node in enumerate(accepted_nodes) if node != k]
        dst = [table.slot(prefix_len + k, self.cache.block_size) for k, node in enumerate(accepted_nodes) if node != k]
        self.cache.copy_slots(src, dst)
        self.cache.truncate(table, prefix_len + len(accepted_nodes))


@dataclass(frozen=True)
class PackedChunks:
    """Many chunks flattened into one forward's inputs, with the attention metadata over the paged cache."""

    tokens: Tensor  # [T] int64, every chunk's new tokens in order
    positions: Tensor  # [T] int64
    ctx: AttentionContext
    prefixes: list[int]  # cache length of each chunk's sequence before its new tokens
    starts: list[int]  # [len(chunks) + 1] offsets of each chunk's rows in `tokens`


def pack(cache: PagedKVCache, chunks: list[Chunk], device: torch.device) -> PackedChunks:
    """Append every chunk's slots to its table and build the one AttentionContext of the pass.

    Every forward over a paged cache (the target's, a draft model's, an EAGLE predictor's) packs its chunks
    here, so attention metadata has one builder.
    """
    tables, prefixes, counts, slots, tokens, positions, masks = [], [], [], [], [], [], []
    for chunk in chunks:
        prefixes.append(chunk.table.length)
        new_slots = cache.append(chunk.table, len(chunk.tokens))
        if new_slots is None:
            raise OutOfBlocksError("a KV cache has no room for a scheduled chunk; raise kv_cache_tokens")
        tables.append(chunk.table.blocks)
        counts.append(len(chunk.tokens))
        slots.extend(new_slots)
        tokens.extend(chunk.tokens)
        positions.extend(chunk.positions)
        masks.append(chunk.mask)
    starts = [0]
    for n in counts:
        starts.append(starts[-1] + n)
    ctx = AttentionContext.build(tables, prefixes, counts, slots, device,
                                 masks if any(m is not None for m in masks) else None)
    return PackedChunks(torch.tensor(tokens, dtype=torch.int64, device=device),
                        torch.tensor(positions, dtype=torch.int64, device=device), ctx, prefixes, starts)
