"""CUDA graphs of the target's small steps (decodes, tree verifications): replayed instead of re-launched.

Why: on a GPU a batch-1 step is bound by the host, not the chip. One bf16 decode step of an 8B model took
22.9 ms eager with the GPU busy 6.1 ms (1,452 kernel launches, each paying Python, dispatch and a launch), and
6.7 ms as a replayed graph with identical logits (bench/results/gpu_session_h200). Speculation needs the same:
a 64-node tree step fell from 27.5 to 8.4 ms.

How (the vLLM / SGLang scheme, sized for trees): a step's shape is rounded up to a *bucket* of (kind, sequences,
tokens), powers of two, and one graph per bucket is captured the first time a step of that shape comes. The
graph reads fixed input buffers; each step copies its real inputs into their leading rows. Padding never
touches real data:
* pad sequences of a tree or causal step have no tokens (`query_start_loc` repeats the real total), so the
  attention kernel's surplus tiles skip them, and tokens past the real ones belong to no sequence at all;
* pad sequences of a decode step attend to one token of whatever block their stale table row names (read,
  never written);
* every pad token writes its K/V to a scratch slot the block pool never hands out (`PagedKVCache(scratch=True)`);
* the rows of pad tokens are dropped from the logits. No operation of the model mixes rows except attention,
  so what pad rows hold cannot reach real ones.
The attention kernel's launch shape is a function of tensor shapes only (kernels/triton/attention.py), so one
capture serves every step of its bucket. Prefill chunks, calls that return features (EAGLE) and steps beyond
the largest bucket run eagerly.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.kvcache import PagedKVCache
from specdec.models.context import AttentionContext
from specdec.models.llama import LlamaModel

MIN_TREE_TOKENS = 16  # the smallest token bucket of a tree or causal step (a decode bucket is its batch)


def bucket(n: int, least: int = 1) -> int:
    """The smallest power of two >= max(n, least)."""
    return 1 << (max(n, least) - 1).bit_length()


@dataclass(frozen=True)
class StepShape:
    """A step's bucket: what one captured graph serves."""

    kind: str  # "decode" (one token per sequence, no mask), "causal" (no mask) or "tree" (bit-packed mask)
    seqs: int
    tokens: int
    mask_words: int  # int32 words per row of the tree mask (0 without one)

    @staticmethod
    def of(ctx: AttentionContext, num_tokens: int) -> "StepShape":
        seqs = ctx.prefix_lens.shape[0]
        if ctx.decode_only:
            return StepShape("decode", bucket(seqs), bucket(seqs), 0)
        tokens = bucket(num_tokens, MIN_TREE_TOKENS)
        if ctx.tree_mask is None:
            return StepShape("causal", bucket(seqs), tokens, 0)
        return StepShape("tree", bucket(seqs), tokens, -(-tokens // 32))


class _Buffers:
    """A graph's fixed inputs, set to an all-padding step (what it runs while being captured)."""

    def __init__(self, shape: StepShape, width: int, scratch_slot: int, device: torch.device) -> None:
        i32 = dict(dtype=torch.int32, device=device)
        self.scratch_slot = scratch_slot
        self.tokens = torch.zeros(shape.tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(shape.tokens, dtype=torch.int64, device=device)
        self.slots = torch.full((shape.tokens,), scratch_slot, dtype=torch.int64, device=device)
        self.tables = torch.zeros(shape.seqs, width, **i32)
        self.prefix_lens = torch.zeros(shape.seqs, **i32)
        decode = shape.kind == "decode"
        self.starts = torch.arange(shape.seqs + 1, **i32) if decode else torch.zeros(shape.seqs + 1, **i32)
        self.seq_lens = torch.ones(shape.seqs, **i32) if decode else None
        self.mask = torch.zeros(shape.tokens, shape.mask_words, **i32) if shape.kind == "tree" else None
        self.rows = torch.arange(shape.tokens, dtype=torch.int64, device=device)
        self.ctx = AttentionContext(self.slots, self.tables, self.prefix_lens, self.starts, self.mask, decode,
                                    self.seq_lens)

    def load(self, tokens: Tensor, positions: Tensor, ctx: AttentionContext) -> None:
        """Copy a real step into the leading rows, and reset what an earlier, larger step of the bucket left in
        the padding: its slots (pad tokens must write the scratch slot, never a real one) and, decoding, its
        sequence lengths (a pad sequence reads one token, not an old sequence's whole context)."""
        n, seqs = tokens.shape[0], ctx.prefix_lens.shape[0]
        self.tokens[:n].copy_(tokens)
        self.positions[:n].copy_(positions)
        self.slots[:n].copy_(ctx.slot_mapping)
        self.slots[n:].fill_(self.scratch_slot)
        self.tables[:seqs, : ctx.block_tables.shape[1]].copy_(ctx.block_tables)
        self.prefix_lens[:seqs].copy_(ctx.prefix_lens)
        if self.seq_lens is not None:
            self.seq_lens[:seqs].copy_(ctx.seq_lens)
            self.seq_lens[seqs:].fill_(1)
        else:
            self.starts[: seqs + 1].copy_(ctx.query_start_loc)
            self.starts[seqs + 1:].fill_(n)
        if self.mask is not None:
            self.mask[:n, : ctx.tree_mask.shape[1]].copy_(ctx.tree_mask)


class _Graph:
    """One captured forward and its buffers."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache, buffers: _Buffers) -> None:
        self.buffers = buffers
        device = buffers.tokens.device

        def forward() -> Tensor:
            b = buffers
            return model(b.tokens, b.positions, b.ctx, cache.layers, logits_rows=b.rows).logits

        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # compile the kernels and size cuBLAS's workspace before capture
            for _ in range(2):
                forward()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = forward()

    def replay(self, tokens: Tensor, positions: Tensor, ctx: AttentionContext) -> Tensor:
        self.buffers.load(tokens, positions, ctx)
        self.graph.replay()
        return self.logits[: tokens.shape[0]].clone()  # the next replay overwrites the graph's output


def graphs_apply(model: LlamaModel) -> bool:
    """Whether this model's steps can be captured: on CUDA with the Triton kernels (the torch reference reads
    its metadata on the host, which a capture forbids; `SPECDEC_FORCE_REFERENCE=1` selects it)."""
    from specdec.kernels.dispatch import triton_active

    return model.device.type == "cuda" and triton_active()


class CudaGraphs:
    """The captured graphs of one target runner, by bucket; `None` from `forward` means: run eagerly."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache, max_tokens: int) -> None:
        if cache.scratch_slot is None:
            raise ValueError("CUDA graphs need a cache with a scratch slot (PagedKVCache(scratch=True))")
        self.model, self.cache, self.max_tokens = model, cache, max_tokens
        # Table width of every graph: the longest sequence the model allows, or the whole pool if smaller.
        longest = -(-model.config.max_position // cache.block_size) + 1
        self.width = min(cache.pool.num_blocks, longest)
        self.graphs: dict[StepShape, _Graph | None] = {}  # None: its capture failed, that shape runs eagerly

    def forward(self, tokens: Tensor, positions: Tensor, ctx: AttentionContext) -> Tensor | None:
        """The logits of every row of this step from a replayed graph, or None where no graph serves it."""
        if ctx.block_tables.shape[1] > self.width:
            return None
        shape = StepShape.of(ctx, tokens.shape[0])
        if shape.tokens > self.max_tokens:  # a bucket holds at least the step's tokens
            return None
        if shape not in self.graphs:
            self.graphs[shape] = self._capture(shape, tokens.device)
        graph = self.graphs[shape]
        return None if graph is None else graph.replay(tokens, positions, ctx)

    def _capture(self, shape: StepShape, device: torch.device) -> _Graph | None:
        """A new graph for `shape`, or None (with one warning) where capturing fails: that shape then runs eagerly,
        which is always correct, rather than failing the request."""
        try:
            return _Graph(self.model, self.cache, _Buffers(shape, self.width, self.cache.scratch_slot, device))
        except RuntimeError as error:
            warnings.warn(f"specdec: CUDA graph capture failed for {shape}; those steps run eagerly ({error})",
                          RuntimeWarning, stacklevel=3)
            return None
