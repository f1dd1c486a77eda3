"""Pick a kernel implementation by device: Triton on CUDA, the torch reference elsewhere.

`SPECDEC_FORCE_REFERENCE=1` forces the reference on CUDA too, to tell a kernel bug from a model bug.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

from torch import Tensor

from specdec.kernels import reference


@functools.lru_cache(maxsize=None)
def _triton_module() -> ModuleType | None:
    if os.environ.get("SPECDEC_FORCE_REFERENCE", "") not in ("", "0"):
        return None
    try:
        from specdec.kernels import triton as triton_kernels
    except ImportError:
        return None
    return triton_kernels


def backend_for(tensor: Tensor) -> ModuleType:
    """The module whose kernels serve tensors on this device."""
    if tensor.is_cuda:
        module = _triton_module()
        if module is not None:
            return module
    return reference


def write_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    backend_for(k_cache).write_kv(k, v, k_cache, v_cache, slot_mapping)


def copy_kv_slots(k_cache: Tensor, v_cache: Tensor, src_slots: Tensor, dst_slots: Tensor) -> None:
    backend_for(k_cache).copy_kv_slots(k_cache, v_cache, src_slots, dst_slots)


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    prefix_lens: Tensor,
    query_start_loc: Tensor,
    tree_mask: Tensor | None,
    scale: float,
    workspace: dict | None = None,
) -> Tensor:
    """`workspace` lets the torch reference reuse its gather plan across layers; Triton needs none."""
    backend = backend_for(q)
    if backend is reference:
        return reference.paged_attention(
            q, k_cache, v_cache, block_tables, prefix_lens, query_start_loc, tree_mask, scale, workspace
        )
    return backend.paged_attention(q, k_cache, v_cache, block_tables, prefix_lens, query_start_loc, tree_mask, scale)


def decode_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float,
    workspace: dict | None = None,
) -> Tensor:
    backend = backend_for(q)
    if backend is reference:
        return reference.decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, workspace)
    return backend.decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)
