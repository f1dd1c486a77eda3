"""Triton kernels with the exact signatures of `specdec.kernels.reference`; `dispatch.py` picks them on CUDA.

One file per kernel: `attention.py` (the shared flash-style paged attention + split-K combine),
`tree_attention.py` (`paged_attention`), `decode_attention.py`, `kv_ops.py` (`write_kv`, `copy_kv_slots`).
Under `TRITON_INTERPRET=1` they also run on CPU tensors, which is how the tests check them without a GPU
(fp32/fp16 only: the interpreter mis-computes bf16 dots).
"""

from specdec.kernels.triton.decode_attention import decode_attention
from specdec.kernels.triton.kv_ops import copy_kv_slots, write_kv
from specdec.kernels.triton.tree_attention import paged_attention

__all__ = ["copy_kv_slots", "decode_attention", "paged_attention", "write_kv"]
