"""Triton KV-cache row movers: `write_kv` (scatter new tokens into their slots) and `copy_kv_slots` (rollback
compaction). Same signatures and semantics as `reference.py`.

Both are one kernel, `_copy_rows_kernel`, that copies rows `[kv_heads, head_dim]` of K and V together from
`src[src_rows[i]]` to `dst[dst_rows[i]]` (either index may be the identity). Grid: `(rows, cdiv(kv_heads,
BLOCK_H))`, one `[BLOCK_H, BLOCK_D]` tile per program, so each program moves a few KiB with wide accesses.

`copy_kv_slots` must read every source before writing any destination (an accepted path may be moved onto
slots that are themselves sources). Programs of one launch run in no fixed order, so it gathers into a
temporary buffer in one launch and scatters from it in a second: launches on a stream are ordered.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _copy_rows_kernel(
    src_k, src_v, dst_k, dst_v, src_rows, dst_rows,
    stride_sk_row, stride_sk_head, stride_sv_row, stride_sv_head, stride_d_row, stride_d_head,
    num_heads,
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    SRC_IDENTITY: tl.constexpr, DST_IDENTITY: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0).to(tl.int64)
    if SRC_IDENTITY:
        src = i
    else:
        src = tl.load(src_rows + i).to(tl.int64)
    if DST_IDENTITY:
        dst = i
    else:
        dst = tl.load(dst_rows + i).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads < num_heads)[:, None] & (dims < HEAD_DIM)[None, :]
    dst_offs = dst * stride_d_row + heads[:, None] * stride_d_head + dims[None, :]
    k = tl.load(src_k + src * stride_sk_row + heads[:, None] * stride_sk_head + dims[None, :], mask=mask)
    v = tl.load(src_v + src * stride_sv_row + heads[:, None] * stride_sv_head + dims[None, :], mask=mask)
    tl.store(dst_k + dst_offs, k.to(dst_k.dtype.element_ty), mask=mask)
    tl.store(dst_v + dst_offs, v.to(dst_v.dtype.element_ty), mask=mask)


def _copy_rows(
    src_k: Tensor,  # [R_src, kv_heads, head_dim]
    src_v: Tensor,
    dst_k: Tensor,  # [R_dst, kv_heads, head_dim]; dst_v shares its strides
    dst_v: Tensor,
    src_rows: Tensor | None,  # [M] int64 rows of src, or None for 0..M-1
    dst_rows: Tensor | None,  # [M] int64 rows of dst, or None for 0..M-1
    count: int,
) -> None:
    """Launch `_copy_rows_kernel` for `count` rows of K and V."""
    if count == 0:
        return
    if src_k.stride(-1) != 1 or src_v.stride(-1) != 1 or dst_k.stride(-1) != 1 or dst_k.stride() != dst_v.stride():
        raise ValueError("rows must have a contiguous head_dim, and the two destinations equal strides")
    num_heads, head_dim = dst_k.shape[1], dst_k.shape[2]
    block_d = triton.next_power_of_2(head_dim)
    block_h = min(triton.next_power_of_2(num_heads), max(1, 4096 // block_d))
    index = src_rows if src_rows is not None else dst_rows
    _copy_rows_kernel[(count, triton.cdiv(num_heads, block_h))](
        src_k, src_v, dst_k, dst_v,
        index if src_rows is None else src_rows, index if dst_rows is None else dst_rows,
        src_k.stride(0), src_k.stride(1), src_v.stride(0), src_v.stride(1), dst_k.stride(0), dst_k.stride(1),
        num_heads,
        HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d,
        SRC_IDENTITY=src_rows is None, DST_IDENTITY=dst_rows is None,
    )  # fmt: skip


def write_kv(
    k: Tensor,  # [T, kv_heads, head_dim]
    v: Tensor,  # [T, kv_heads, head_dim]
    k_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    slot_mapping: Tensor,  # [T] int64; slot of each new token
) -> None:
    """Scatter new tokens' K/V into their cache slots (in place), casting to the cache dtype.

    `k`/`v` may be strided views (e.g. slices of a fused QKV projection); only head_dim must be contiguous."""
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_flat, v_flat = k_cache.view(-1, kv_heads, head_dim), v_cache.view(-1, kv_heads, head_dim)
    _copy_rows(k, v, k_flat, v_flat, None, slot_mapping, k.shape[0])


def copy_kv_slots(
    k_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: Tensor,
    src_slots: Tensor,  # [M] int64
    dst_slots: Tensor,  # [M] int64
) -> None:
    """Copy K/V rows between slots (in place): gather every source, then scatter, so overlaps are safe."""
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_flat, v_flat = k_cache.view(-1, kv_heads, head_dim), v_cache.view(-1, kv_heads, head_dim)
    count = src_slots.shape[0]
    k_tmp = torch.empty((count, kv_heads, head_dim), dtype=k_cache.dtype, device=k_cache.device)
    v_tmp = torch.empty((count, kv_heads, head_dim), dtype=v_cache.dtype, device=v_cache.device)
    _copy_rows(k_flat, v_flat, k_tmp, v_tmp, src_slots, None, count)
    _copy_rows(k_tmp, v_tmp, k_flat, v_flat, None, dst_slots, count)
