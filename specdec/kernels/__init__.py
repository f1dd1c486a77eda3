"""Attention and KV-cache kernels behind one dispatch point.

`specdec.kernels.dispatch` picks the Triton kernels on CUDA and the torch reference everywhere else.
Every kernel takes plain tensors and has a reference in `reference.py` with the same signature.
"""

from specdec.kernels.dispatch import (
    argmax_rows,
    copy_kv_layers,
    copy_kv_slots,
    decode_attention,
    linear_q4,
    linear_q8,
    paged_attention,
    quantize,
    rms_norm,
    rope_kv,
    silu_mul,
    top_k_probs,
    write_kv,
)
from specdec.kernels.reference import FLOAT, Q8, ROWSCALE

__all__ = ["FLOAT", "Q8", "ROWSCALE", "argmax_rows", "copy_kv_layers", "copy_kv_slots", "decode_attention",
           "linear_q4", "linear_q8", "paged_attention", "quantize", "rms_norm", "rope_kv", "silu_mul", "top_k_probs",
           "write_kv"]
