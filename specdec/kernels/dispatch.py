"""Pick a kernel implementation by device: Triton on CUDA, the compiled CPU kernels for float32 on CPU, the
torch reference elsewhere (and wherever those cannot be built).

`SPECDEC_FORCE_REFERENCE=1` forces the reference on CUDA too, to tell a kernel bug from a model bug;
`SPECDEC_CPU_KERNELS=0` does the same on CPU.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

import torch
from torch import Tensor

from specdec.kernels import cpu, reference


@functools.lru_cache(maxsize=None)
def _triton_module() -> ModuleType | None:
    if os.environ.get("SPECDEC_FORCE_REFERENCE", "") not in ("", "0"):
        return None
    try:
        from specdec.kernels import triton as triton_kernels
    except ImportError:
        return None
    return triton_kernels


def triton_active() -> bool:
    """Whether CUDA tensors get the Triton kernels (not the torch reference)."""
    return _triton_module() is not None


def backend_for(tensor: Tensor) -> ModuleType:
    """The module whose kernels serve tensors on this device."""
    if tensor.is_cuda:
        module = _triton_module()
        if module is not None:
            return module
    elif tensor.dtype == torch.float32 and tensor.device.type == "cpu" and cpu.available():
        return cpu
    return reference


def write_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    backend_for(k_cache).write_kv(k, v, k_cache, v_cache, slot_mapping)


def copy_kv_slots(k_cache: Tensor, v_cache: Tensor, src_slots: Tensor, dst_slots: Tensor) -> None:
    backend_for(k_cache).copy_kv_slots(k_cache, v_cache, src_slots, dst_slots)


def copy_kv_layers(layers: list[tuple[Tensor, Tensor]], src_slots: Tensor, dst_slots: Tensor) -> None:
    """`copy_kv_slots` in every layer's (K, V) caches: the compaction of an accepted tree path. The compiled copy
    moves bytes, so it serves CPU caches of every dtype (a bfloat16 cache went through 60 torch calls a copy)."""
    backend = backend_for(layers[0][0])
    if layers[0][0].device.type == "cpu" and cpu.available():
        cpu.copy_kv_layers([k for k, _ in layers], [v for _, v in layers], src_slots, dst_slots)
        return
    for k_cache, v_cache in layers:
        backend.copy_kv_slots(k_cache, v_cache, src_slots, dst_slots)


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
    backend = backend_for(k_cache)
    if backend is not _triton_module():
        return backend.paged_attention(
            q, k_cache, v_cache, block_tables, prefix_lens, query_start_loc, tree_mask, scale, workspace
        )
    return backend.paged_attention(q, k_cache, v_cache, block_tables, prefix_lens, query_start_loc, tree_mask, scale)


def decode_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, scale: float,
    workspace: dict | None = None,
) -> Tensor:
    backend = backend_for(k_cache)
    if backend is not _triton_module():
        return backend.decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, workspace)
    return backend.decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)


def rms_norm(x: Tensor, weight: Tensor, eps: float, mode: int = 0, residual: Tensor | None = None,
             residual_scale: Tensor | None = None) -> list[Tensor]:
    return _elementwise(x).rms_norm(x, weight, eps, mode, residual, residual_scale)


def silu_mul(gate_up: Tensor, scale: Tensor | None = None, mode: int = 0) -> list[Tensor]:
    return _elementwise(gate_up).silu_mul(gate_up, scale, mode)


def quantize(x: Tensor, mode: int) -> list[Tensor]:
    return _elementwise(x).quantize(x, mode)


def linear_q8(q: Tensor, s: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None = None,
              weight_bits: int = 8, w_blocks: Tensor | None = None) -> Tensor:
    return _elementwise(s).linear_q8(q, s, w, w_scale, bias, weight_bits, w_blocks)


def linear_q4(q: Tensor, s: Tensor, gsum: Tensor, w: Tensor, d: Tensor, m_t: Tensor, bias: Tensor | None = None) -> Tensor:
    return _elementwise(s).linear_q4(q, s, gsum, w, d, m_t, bias)


def rope_kv(qkv: Tensor, scale: Tensor | None, bias: Tensor | None, positions: Tensor, cos: Tensor, sin: Tensor,
            k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor, q_heads: int, kv_heads: int) -> Tensor:
    backend = _elementwise(qkv) if k_cache.dtype == qkv.dtype else reference
    return backend.rope_kv(qkv, scale, bias, positions, cos, sin, k_cache, v_cache, slot_mapping, q_heads, kv_heads)


def argmax_rows(logits: Tensor) -> Tensor:
    """Each row's index of its largest logit (the first on ties), `[N]` int64; -1 for a row with NaN or +Inf."""
    return _elementwise(logits).argmax_rows(logits)


def top_k_probs(logits: Tensor, k: int) -> list[Tensor]:
    """Softmax probabilities `[N, k]` and indices `[N, k]` of each row's k largest logits, largest first."""
    return _elementwise(logits).top_k_probs(logits, k)


def _elementwise(tensor: Tensor) -> ModuleType:
    """The fused elementwise kernels exist for CPU float32; everything else runs the reference's torch ops."""
    return cpu if backend_for(tensor) is cpu else reference
