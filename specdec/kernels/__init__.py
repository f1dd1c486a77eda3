"""Attention and KV-cache kernels behind one dispatch point.

`specdec.kernels.dispatch` picks the Triton kernels on CUDA and the torch reference everywhere else.
Every kernel takes plain tensors and has a reference in `reference.py` with the same signature.
"""

from specdec.kernels.dispatch import copy_kv_slots, decode_attention, paged_attention, write_kv

__all__ = ["copy_kv_slots", "decode_attention", "paged_attention", "write_kv"]
