"""QLinear: int8 or int4 weights with int8 activations, on our own CPU kernels (specdec/kernels/cpu/qlinear.cpp).

Why not fbgemm (Int8DynamicLinear, quant.py): at one to a few rows, the shape of decode and tree verification,
fbgemm's dynamic W8A8 spends about as long on its own activation quantization and output dequantization as on
the matmul, and needs five torch ops around each call to keep rows independent. Here the activation arrives
already quantized per row (the norm or activation kernel before the linear writes it, `forward_q8`), the
products are summed exactly in integers, and the per-row and per-channel scales are applied in the same pass.
Exact integer sums also make a row's output independent of its batch and of how the kernel tiles the work.

Formats:
* bits=8: symmetric int8 per output channel (as Int8DynamicLinear), 1 byte a weight.
* bits=7: the same on a grid of [-63, 63], 1 byte a weight: ~1.3x faster at 2-8 rows on AVX2 (see qlinear.cpp),
  the same speed at one row (bound by memory there) and on AVX-512 VNNI.
* bits=4: 4-bit values per group of 32 along the input with a float16 scale and offset per group,
  w = d q + m, q in [0, 15]: GGUF's Q4_1 format, so a Q4_1 model (the default SmolLM2 GGUF) gets its
  weights back exactly; 5 bits a weight.
Activations: symmetric int8 per row (scale max|x| / 127), against fbgemm's 7-bit grid.

Inference only, CPU float32 in and out; K (in_features) must be a multiple of 32 (`supports`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from specdec import kernels
from specdec.kernels import cpu as cpu_kernels
from specdec.kernels.reference import AMX_CHUNK, GROUP, pack_q4, pack_q8, pack_q8_blocks, unpack_q4, unpack_q8
from specdec.models.quant import quantize_weight_per_channel

__all__ = ["QLinear", "quantize_weight_q4"]


def quantize_weight_q4(weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric 4-bit per group of 32 along K: returns (packed uint8 [N, K/2], d float16 [N, K/32],
    m_t float16 [K/32, N]) with w = d q + m.

    m = the group's min and d = (max - min) / 15, both rounded to float16 (as GGUF's Q4_1 stores them), then
    q = round((w - m) / d) in [0, 15] (q = 0 where d = 0). Byte j of a group holds q[j] in its low and q[j + 16]
    in its high nibble. m is stored transposed: the kernel adds the offsets eight columns at a time.
    """
    w = weight.detach().to(torch.float32)
    n, k = w.shape
    groups = w.view(n, k // GROUP, GROUP)
    lo, hi = groups.amin(-1), groups.amax(-1)
    m = lo.half()
    d = ((hi - m.float()) / 15.0).half()
    d32 = d.float()[..., None]
    q = torch.where(d32 > 0, torch.round((groups - m.float()[..., None]) / d32.clamp_min(1e-30)),
                    torch.zeros_like(groups)).clamp_(0, 15).to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)
    return packed.reshape(n, k // 2).contiguous(), d.contiguous(), m.T.contiguous()


class QLinear(nn.Module):
    """y = x @ W.T + b with W in int8 (per channel) or int4 (per group of 32) and x quantized per row."""

    def __init__(self, in_features: int, out_features: int, bits: int, weight: Tensor, scales: tuple[Tensor, ...],
                 bias: Tensor | None) -> None:
        """`weight` and the scales in the kernels' tiled layout (specdec.kernels.reference.pack_q8 / pack_q4);
        build from a float layer with `from_linear`."""
        super().__init__()
        if bits not in (4, 7, 8):
            raise ValueError(f"QLinear supports 8, 7 or 4 bits, got {bits}")
        if not self.supports(in_features):
            raise ValueError(f"QLinear needs in_features divisible by {GROUP}, got {in_features}")
        self.in_features, self.out_features, self.bits = in_features, out_features, bits
        self.register_buffer("weight", weight)
        if bits != 4:
            self.register_buffer("weight_scale", scales[0])
            # The weights again in blocks of 16 channels, for the AMX tiles and the VNNI kernel with channels in
            # lanes (qlinear_amx.cpp, qlinear_vnni.cpp): one more byte a weight, for verified rows that cost the
            # linears little more than one row. Not saved: it is rebuilt from `weight` on load.
            blocked = in_features % AMX_CHUNK == 0 and cpu_kernels.blocked_weights()
            self.register_buffer("weight_blocks", pack_q8_blocks(weight, out_features) if blocked else None,
                                 persistent=False)
        else:
            self.register_buffer("d", scales[0])
            self.register_buffer("m_t", scales[1])
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).contiguous().clone())

    def cold_tensors(self) -> tuple[str, ...]:
        """Buffers no decode step reads here (specdec/models/huge_pages.py leaves them on ordinary pages): the
        4-channel tiles where the kernels read the 16-channel blocks instead (qlinear.cpp's `blocked`)."""
        blocked = self.bits != 4 and self.weight_blocks is not None and cpu_kernels.blocked_weights()
        return ("weight",) if blocked else ()

    @staticmethod
    def supports(in_features: int) -> bool:
        return in_features % GROUP == 0

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 8) -> "QLinear":
        """Quantize a float `nn.Linear` (left untouched)."""
        if not cls.supports(linear.in_features):
            raise ValueError(f"QLinear needs in_features divisible by {GROUP}, got {linear.in_features}")
        if bits != 4:
            q, scale = quantize_weight_per_channel(linear.weight, bits)
            tiles, scales = pack_q8(q), (scale.contiguous(),)
        else:
            q, d, m_t = quantize_weight_q4(linear.weight)
            tiles, d_tiles = pack_q4(q, d)
            scales = (d_tiles, m_t)
        return cls(linear.in_features, linear.out_features, bits, tiles, scales, linear.bias)

    def dequantized_weight(self) -> Tensor:
        """The float32 weight [out, in] this layer multiplies by (for tests and inspection)."""
        n = self.out_features
        if self.bits != 4:
            return unpack_q8(self.weight, n).float() * self.weight_scale[:, None]
        w, d = unpack_q4(self.weight, self.d, n)
        lo, hi = (w & 0x0F).float(), (w >> 4).float()
        q = torch.cat([lo.view(n, -1, 16), hi.view(n, -1, 16)], dim=-1)
        return (q * d.float()[..., None] + self.m_t.float().T[..., None]).reshape(n, self.in_features)

    def forward_q8(self, act: list[Tensor]) -> Tensor:
        """The output `[T, out]` for rows already in form Q8 (`[q, s, gsum]`, see specdec.kernels.reference)."""
        q, s, gsum = act
        if self.bits != 4:
            return kernels.linear_q8(q, s, self.weight, self.weight_scale, self.bias, self.bits, self.weight_blocks)
        return kernels.linear_q4(q, s, gsum, self.weight, self.d, self.m_t, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected [..., {self.in_features}], got {tuple(x.shape)}")
        rows = x.reshape(-1, self.in_features).to(torch.float32).contiguous()
        y = self.forward_q8(kernels.quantize(rows, kernels.Q8))
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        weight = "int4/group32" if self.bits == 4 else f"int{self.bits}/per_channel"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"act=int8/per_row, weight={weight}")
