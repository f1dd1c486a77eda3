"""The one Triton attention kernel behind both `paged_attention` (tree verify, prefill) and `decode_attention`.

Why one kernel: prefill chunks, tree verification and plain decode are all "new tokens over a paged prefix";
they differ only in how many new tokens a sequence has and in the mask among them (see `reference.py`).

Work decomposition (grid `(query tiles, kv heads, splits)`):

* A *query tile* is up to `BLOCK_Q` consecutive new tokens of ONE sequence times the `GROUP` query heads that
  share a kv head, flattened into `BLOCK_M = BLOCK_Q * GROUP` (padded) rows. Every K/V tile is therefore read
  once per group, not once per query head, and decode (1 token x GROUP heads) still fills an MMA tile.
* Tiles are laid out without a host sync: sequence `b` owns tiles from `query_start_loc[b] // BLOCK_Q + b`, so
  `T // BLOCK_Q + B` tiles always suffice; a program finds its sequence by binary search and surplus programs
  return at once. This keeps the launch shape a function of tensor shapes only (CUDA-graph friendly).
* The prefix (fully visible, no mask work) is partitioned across `num_splits` programs (split-K /
  flash-decoding) so that a batch of one over a long context still fills the GPU; split 0 also takes the new
  tokens, whose K/V sit in the cache at positions `prefix + j`, under the causal or bit-packed tree mask. With
  more than one split, each program writes a normalised partial output plus its row max and sum, and
  `_combine_kernel` merges them.

Softmax is the FlashAttention online form in base 2 (`scale * log2(e)` folded into the scores), accumulated in
fp32; no score matrix is materialised.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

Allocator = Callable[..., Tensor]  # torch.empty-like: (shape, *, dtype, device) -> Tensor

_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class AttentionTuning:
    """Launch choices; `None` means "pick by heuristic". Tests force small tiles and split-K through this."""

    block_m: int | None = None  # rows per query tile (tokens x group heads), a power of two >= 16
    block_n: int | None = None  # keys per inner-loop step, a power of two >= 16
    num_splits: int | None = None  # programs sharing one tile's prefix (split-K)
    min_chunk: int = 256  # fewest prefix keys worth a split of their own


@triton.jit
def _sequence_of_tile(query_start_loc, num_seqs, tile, BLOCK_Q: tl.constexpr):
    """Largest `b` with `query_start_loc[b] // BLOCK_Q + b <= tile`: the sequence that owns this tile."""
    lo: tl.int32 = 0
    hi = num_seqs
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc + mid) // BLOCK_Q + mid
        lo = tl.where(first_tile <= tile, mid, lo)
        hi = tl.where(first_tile <= tile, hi, mid)
    return lo


@triton.jit
def _cache_offsets(block_table_row, pos, valid, PAGE: tl.constexpr, stride_page, stride_slot):
    """Element offsets of cache positions `pos` of one sequence, read through its block table (int64: caches
    can exceed 2**31 elements)."""
    page = tl.load(block_table_row + pos // PAGE, mask=valid, other=0).to(tl.int64)
    return page * stride_page + (pos % PAGE).to(tl.int64) * stride_slot


@triton.jit
def _online_softmax_step(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    """Fold one block of base-2 scores `s` (masked entries = -inf) and values `v` into the running state.

    A row that has seen only masked keys keeps max -inf; using 0 as its reference avoids (-inf) - (-inf)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["num_seqs", "num_splits"])
def _attention_kernel(
    q, k_cache, v_cache, out, part_out, part_max, part_sum,
    block_tables, prefix_lens, query_start_loc, tree_mask,
    scale_log2, num_seqs, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_page, stride_slot, stride_head,
    stride_bt, stride_mask, stride_part_split, num_q_heads,
    PAGE: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, SPLIT: tl.constexpr,
    MIN_CHUNK: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq = _sequence_of_tile(query_start_loc, num_seqs, tile, BLOCK_Q)
    q_start = tl.load(query_start_loc + seq)
    q_len = tl.load(query_start_loc + seq + 1) - q_start
    first_q = (tile - q_start // BLOCK_Q - seq) * BLOCK_Q
    if first_q >= q_len:
        return  # a surplus tile of the sync-free layout
    prefix = tl.load(prefix_lens + seq)

    rows = tl.arange(0, BLOCK_M)
    q_idx = first_q + rows // GROUP  # new-token index within the sequence
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (q_idx < q_len)
    token = (q_start + q_idx).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    io_mask = row_ok[:, None] & dim_ok[None, :]
    q_tile = tl.load(q + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :], mask=io_mask, other=0.0)
    q_tile = q_tile.to(k_cache.dtype.element_ty)

    bt_row = block_tables + seq.to(tl.int64) * stride_bt
    k_base = k_cache + kv_head * stride_head
    v_base = v_cache + kv_head * stride_head
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # This split's share of the committed prefix: every query sees all of it, so no mask beyond bounds.
    chunk = tl.maximum(tl.cdiv(tl.cdiv(prefix, num_splits), BLOCK_N) * BLOCK_N, MIN_CHUNK)
    kv_lo = split * chunk
    kv_hi = tl.minimum(kv_lo + chunk, prefix)
    for start in range(kv_lo, kv_hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        key_ok = pos < kv_hi
        offs = _cache_offsets(bt_row, pos, key_ok, PAGE, stride_page, stride_slot)
        k = tl.load(k_base + offs[None, :] + dims[:, None], mask=key_ok[None, :] & dim_ok[:, None], other=0.0)
        v = tl.load(v_base + offs[:, None] + dims[None, :], mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
        s = tl.dot(q_tile, k, input_precision=DOT_PRECISION) * scale_log2
        s = tl.where(key_ok[None, :], s, float("-inf"))
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, DOT_PRECISION)

    # The new tokens (split 0 only). Causal tiles stop at their last query; tree masks are read as bits.
    new_hi = q_len
    if CAUSAL:
        new_hi = tl.minimum(q_len, first_q + BLOCK_Q)
    new_hi = tl.where(split == 0, new_hi, 0)
    for j0 in range(0, new_hi, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        key_ok = j < new_hi
        offs = _cache_offsets(bt_row, prefix + j, key_ok, PAGE, stride_page, stride_slot)
        k = tl.load(k_base + offs[None, :] + dims[:, None], mask=key_ok[None, :] & dim_ok[:, None], other=0.0)
        v = tl.load(v_base + offs[:, None] + dims[None, :], mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
        s = tl.dot(q_tile, k, input_precision=DOT_PRECISION) * scale_log2
        if CAUSAL:
            sees = j[None, :] <= q_idx[:, None]
        else:
            word_ptrs = tree_mask + token[:, None] * stride_mask + (j // 32)[None, :]
            words = tl.load(word_ptrs, mask=row_ok[:, None] & key_ok[None, :], other=0)
            sees = ((words >> (j % 32)[None, :]) & 1) != 0
        s = tl.where(sees & key_ok[None, :], s, float("-inf"))
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, DOT_PRECISION)

    result = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if not SPLIT:
        out_ptrs = out + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptrs, result.to(out.dtype.element_ty), mask=io_mask)
    else:
        part = split.to(tl.int64) * stride_part_split + token * num_q_heads + head  # [splits, T, Hq] index
        tl.store(part_max + part, m_i, mask=row_ok)
        tl.store(part_sum + part, l_i, mask=row_ok)
        tl.store(part_out + part[:, None] * HEAD_DIM + dims[None, :], result, mask=io_mask)


@triton.jit(do_not_specialize=["num_splits"])
def _combine_kernel(
    out, part_out, part_max, part_sum,
    stride_ot, stride_oh, stride_part_split, num_q_heads, num_splits,
    SPLITS_POW2: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Merge the splits of one (token, q head): weight each normalised partial by `sum * 2**(max - global max)`."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_POW2)
    split_ok = splits < num_splits
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HEAD_DIM
    part = splits.to(tl.int64) * stride_part_split + token * num_q_heads + head
    m = tl.load(part_max + part, mask=split_ok, other=float("-inf"))
    l = tl.load(part_sum + part, mask=split_ok, other=0.0)
    m_all = tl.max(m, 0)
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.exp2(m - m_all) * l  # empty splits: l = 0 and a zero partial
    o = tl.load(part_out + part[:, None] * HEAD_DIM + dims[None, :], mask=split_ok[:, None] & dim_ok[None, :], other=0.0)
    total = tl.sum(w, 0)
    result = tl.sum(o * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out + token * stride_ot + head * stride_oh + dims, result.to(out.dtype.element_ty), mask=dim_ok)


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    """SM count: the split heuristic aims for a few programs per SM. (CPU/interpreter: 1, to keep grids tiny.)"""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _tile_shape(tokens: int, seqs: int, group: int, block_d: int, fp32: bool) -> tuple[int, int]:
    """(rows, keys) of a tile. Rows follow the mean new tokens per sequence (known without a sync): decode and
    small trees get small tiles (less padding), long chunks big ones (fewer K/V re-reads). The caps keep the
    sm_90 build free of register spills (checked with ptxas for bf16/fp16 at head_dim 64/128/256); the
    exact-fp32 dot is an FMA loop holding its operands in registers, so fp32 (a debugging dtype) gets small
    tiles and 8 warps."""
    mean_tokens = triton.cdiv(tokens, max(seqs, 1))
    cap = 32 if fp32 else (128 if block_d <= 128 else 64)
    rows = max(16, min(cap, triton.next_power_of_2(mean_tokens * group)))
    return rows, (16 if fp32 else 64 if block_d <= 128 else 32)


def _num_warps(block_m: int, block_d: int, fp32: bool) -> int:
    """8 warps (two wgmma warpgroups) for 128-row tiles, tiles above 64 x 128 and fp32; else 4. Each choice
    builds without register spills for sm_90 (bench/sm90_build_check.py)."""
    return 8 if fp32 or block_m >= 128 or block_m * block_d > 64 * 128 else 4


def choose_splits(base_programs: int, max_context: int, min_chunk: int, num_sms: int) -> int:
    """Enough splits for ~4 programs per SM, but none shorter than `min_chunk` keys and at most 64.

    `max_context` is the block-table capacity, an upper bound known without reading `prefix_lens`; a sequence
    shorter than that just leaves its trailing splits empty (they exit after writing a zero partial)."""
    target = 4 * num_sms
    if base_programs >= target or max_context <= min_chunk:
        return 1
    return int(min(triton.cdiv(target, base_programs), triton.cdiv(max_context, min_chunk), 64))


def attention(
    q: Tensor,  # [T, q_heads, head_dim]
    k_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: Tensor,
    block_tables: Tensor,  # [B, max_blocks] int32
    prefix_lens: Tensor,  # [B] int32
    query_start_loc: Tensor,  # [B + 1] int32
    tree_mask: Tensor | None,  # [T, W] int32 bit-packed, or None for causal
    scale: float,
    *,
    tuning: AttentionTuning = AttentionTuning(),
    alloc: Allocator = torch.empty,
) -> Tensor:  # [T, q_heads, head_dim]
    """`reference.paged_attention` on the GPU. `tuning` overrides launch choices; `alloc` makes every buffer
    (tests pass a NaN-filling allocator so that an element nobody wrote shows up)."""
    num_tokens, q_heads, head_dim = q.shape
    _, page, kv_heads, _ = k_cache.shape
    num_seqs = query_start_loc.shape[0] - 1
    if q_heads % kv_heads:
        raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must share strides with a contiguous head_dim")
    out = alloc(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    mask = query_start_loc if tree_mask is None else tree_mask.contiguous()

    group = q_heads // kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    fp32 = k_cache.dtype == torch.float32
    rows, keys = _tile_shape(num_tokens, num_seqs, group, block_d, fp32)
    block_m = max(tuning.block_m or rows, 16, triton.next_power_of_2(group))
    block_n = tuning.block_n or keys
    tiles = num_tokens // (block_m // group) + num_seqs
    splits = tuning.num_splits or choose_splits(
        tiles * kv_heads, block_tables.shape[1] * page, tuning.min_chunk, _multiprocessors(q.device)
    )

    if splits > 1:
        part_max = alloc((splits, num_tokens, q_heads), dtype=torch.float32, device=q.device)
        part_sum = alloc((splits, num_tokens, q_heads), dtype=torch.float32, device=q.device)
        part_out = alloc((splits, num_tokens, q_heads, head_dim), dtype=torch.float32, device=q.device)
    else:
        part_max = part_sum = part_out = out  # unused
    _attention_kernel[(tiles, kv_heads, splits)](
        q, k_cache, v_cache, out, part_out, part_max, part_sum,
        block_tables, prefix_lens, query_start_loc, mask,
        scale * _LOG2E, num_seqs, splits,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), mask.stride(0), num_tokens * q_heads, q_heads,
        PAGE=page, GROUP=group, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n,
        CAUSAL=tree_mask is None, SPLIT=splits > 1, MIN_CHUNK=tuning.min_chunk,
        DOT_PRECISION="ieee" if fp32 else "tf32",
        num_warps=_num_warps(block_m, block_d, fp32), num_stages=2,
    )  # fmt: skip
    if splits > 1:
        _combine_kernel[(num_tokens, q_heads)](
            out, part_out, part_max, part_sum,
            out.stride(0), out.stride(1), num_tokens * q_heads, q_heads, splits,
            SPLITS_POW2=triton.next_power_of_2(splits), HEAD_DIM=head_dim, BLOCK_D=block_d,
        )  # fmt: skip
    return out

