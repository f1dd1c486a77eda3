"""int8 dynamic W8A8 linear layers for CPU, on fbgemm through torch's quantized ops.

`Int8DynamicLinear` keeps the weight as symmetric int8 with one scale per output channel, packed once
for fbgemm, and quantizes activations on the fly, with one scale per row (token). `quantize_int8_`
swaps every `nn.Linear` of a model for one, in place.

Activations, per row. fbgemm's `quantized::linear_dynamic` quantizes the whole input with one
(asymmetric, uint8) scale, so one loud row (a BOS token with massive activations, a prompt row in a
prefill) would coarsen every other row. We divide each row by its own max |x| before the call and
multiply the output row back after it, which is exact in real arithmetic because the layer is linear in
each row: every row then spans [-1, 1], and the per-tensor grid of fbgemm becomes a per-row grid.
With one row it is the same as plain per-tensor. The price is three small elementwise ops.

Seven-bit activations (`reduce_range=True`). Without AVX-512 VNNI (the AVX2 machines this project
targets) fbgemm multiplies uint8 x int8 with `vpmaddubsw`, which adds two products into a saturating
int16: 255*127*2 overflows it and the result is silently wrong. With activations in [0, 127] the pair
sum stays under 32767, so the result is exact everywhere. So the grid is 127 steps over [-max|x|, max|x|]
per row (about 0.8% of max|x| per step); relative output error on Gaussian data is about 1.6%
(tests/models/test_quant.py). `reduce_range=False` gives 8 bits but is only exact on VNNI CPUs.

Why fbgemm (measured with bench/int8_linear.py; one 2-core AMD EPYC with AVX-512 VNNI, where the
numbers in shared/NOTES.md are from an AVX2 one; the other engineers' tests were running, so medians
are noisy; ms per call of the whole stack):

    python bench/int8_linear.py --reps 25

    MEASURED_TABLE

- `torch._int_mm` (oneDNN s8s8 with per-row scales done by hand) is true 8-bit per-token, but it
  re-reads an unpacked weight and takes more small ops: slower at every row count.
- The oneDNN `quantized::linear_dynamic` (engine "onednn") is per-tensor and slower than fbgemm.
- `onednn::qlinear_pointwise` (what inductor emits) took 16 ms for ONE 576x3072 layer with uint8 input
  and ~1 s with int8 input: unusable in eager mode here.
- `_weight_int8pack_mm` (weight-only int8, fp32 activations) is slower than fp32 at 4+ rows.
- torchao: see the bench's torchao row when it is installed; it is not a dependency of specdec.

Warnings: `torch.quantize_per_channel` now warns that quantized tensor creation is deprecated, so the
packed weight is built with `torch._make_per_channel_quantized_tensor`, which does not. If a later
torch drops quantized tensors or the fbgemm ops, `from_linear` fails loudly (no silent fallback).

CPU only, inference only (no autograd through the quantized op). Pickle/deepcopy are not supported.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import Tensor, nn

__all__ = ["Int8DynamicLinear", "quantize_int8_", "quantize_weight_per_channel"]

# Rows whose max |x| is below this are scaled as if it were this (an all-zero row stays zero, no 0/0).
_MIN_ROW_SCALE = 1e-30


def quantize_weight_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per output channel: returns (int8 [out, in], float32 scales [out]).

    scale = max|w_row| / 127 and q = round_half_even(w / scale) in [-127, 127]; an all-zero row gets
    scale 1 and q = 0.
    """
    w = weight.detach().to(torch.float32)
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


@contextmanager
def _quiet_qtensor_deprecation():
    """Silence only torch 2.13's "quantized tensor creation ... deprecated" warning (see the module doc)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated", category=UserWarning)
        yield


@contextmanager
def _fbgemm_engine():
    """Prepack for fbgemm whatever the process-wide quantized engine is (onednn's is slower here)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise RuntimeError(
            "Int8DynamicLinear needs torch's fbgemm quantized engine (x86-64 with AVX2); this torch has "
            f"{torch.backends.quantized.supported_engines}"
        )
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"
    try:
        yield
    finally:
        torch.backends.quantized.engine = old


class Int8DynamicLinear(nn.Module):
    """y = x @ W.T + b with W int8 per output channel and x quantized per row (or per tensor) at run time.

    Takes [..., in_features] in float32 (bf16/fp16 are cast in, and the output cast back); returns
    [..., out_features]. Build it with `from_linear`.
    """

    def __init__(
        self,
        weight_int8: Tensor,
        weight_scale: Tensor,
        bias: Tensor | None = None,
        *,
        per_token: bool = True,
        reduce_range: bool = True,
    ) -> None:
        super().__init__()
        if weight_int8.dtype != torch.int8 or weight_int8.dim() != 2:
            raise ValueError(f"weight_int8 must be a 2-D int8 tensor, got {weight_int8.dtype} {tuple(weight_int8.shape)}")
        if weight_int8.device.type != "cpu":
            raise ValueError("Int8DynamicLinear runs on CPU only")
        self.out_features, self.in_features = (int(s) for s in weight_int8.shape)
        if weight_scale.shape != (self.out_features,):
            raise ValueError(f"weight_scale must have shape ({self.out_features},), got {tuple(weight_scale.shape)}")
        self.per_token = per_token
        self.reduce_range = reduce_range
        scale = weight_scale.detach().to(torch.float32).contiguous()
        b = None if bias is None else bias.detach().to(torch.float32).contiguous().clone()
        if b is not None and b.shape != (self.out_features,):
            raise ValueError(f"bias must have shape ({self.out_features},), got {tuple(b.shape)}")
        self.register_buffer("bias", b)
        with _quiet_qtensor_deprecation(), _fbgemm_engine():
            qweight = torch._make_per_channel_quantized_tensor(
                weight_int8.detach().contiguous(), scale.double(), torch.zeros(self.out_features, dtype=torch.long), 0
            )
            # Per-tensor mode lets fbgemm add the bias; per-row mode must scale the rows first.
            self._packed = torch.ops.quantized.linear_prepack(qweight, None if per_token else b)
        self._op = torch.ops.quantized.linear_dynamic.default

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, per_token: bool = True, reduce_range: bool = True) -> Int8DynamicLinear:
        """Quantize a (float) `nn.Linear`; the linear and its weight are left untouched."""
        q, scale = quantize_weight_per_channel(linear.weight)
        return cls(q, scale, linear.bias, per_token=per_token, reduce_range=reduce_range)

    @property
    def weight_int8(self) -> Tensor:
        """The int8 weight [out, in], unpacked from fbgemm's layout (a copy; for inspection and tests)."""
        with _quiet_qtensor_deprecation():
            w, _ = torch.ops.quantized.linear_unpack(self._packed)
        return w.int_repr()

    @property
    def weight_scale(self) -> Tensor:
        """The float32 per-output-channel weight scales [out] (a copy)."""
        with _quiet_qtensor_deprecation():
            w, _ = torch.ops.quantized.linear_unpack(self._packed)
        return w.q_per_channel_scales().to(torch.float32)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected [..., {self.in_features}], got {tuple(x.shape)}")
        in_dtype = x.dtype
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if in_dtype != torch.float32:
            x2 = x2.to(torch.float32)
        if self.per_token:
            s = torch.linalg.vector_norm(x2, ord=math.inf, dim=1, keepdim=True).clamp_min_(_MIN_ROW_SCALE)
            y = self._op(x2 / s, self._packed, self.reduce_range)
            y = y.mul_(s) if self.bias is None else torch.addcmul(self.bias, y, s)
        else:
            y = self._op(x2, self._packed, self.reduce_range)
        y = y.view(*lead, self.out_features)
        return y if in_dtype == torch.float32 else y.to(in_dtype)

    def extra_repr(self) -> str:
        act = "per_token" if self.per_token else "per_tensor"
        bits = 7 if self.reduce_range else 8
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"act={act}/{bits}bit, weight=int8/per_channel"
        )


def quantize_int8_(
    module: nn.Module,
    skip: Callable[[str], bool] | None = None,
    *,
    per_token: bool = True,
    reduce_range: bool = True,
) -> int:
    """Replace every `nn.Linear` under `module` (exact type; subclasses keep their own forward) in place.

    `skip(qualified_name)` returning True keeps that linear in float. Returns how many Linear modules were
    replaced (a module reached under two names counts once and gets one replacement). Weights shared
    with other modules (a tied LM head and its nn.Embedding) are read, not changed: the embedding keeps
    its float weight and the head gets its own int8 copy. `module` itself is not replaced when it is a
    Linear: wrap it first.
    """
    # Every place a Linear is reachable from: (parent, attribute name, qualified name).
    sites: dict[int, tuple[nn.Linear, list[tuple[nn.Module, str, str]]]] = {}
    for parent_name, parent in module.named_modules(remove_duplicate=False):
        for child_name, child in parent.named_children():
            if type(child) is nn.Linear:
                qualified = f"{parent_name}.{child_name}" if parent_name else child_name
                sites.setdefault(id(child), (child, []))[1].append((parent, child_name, qualified))
    count = 0
    for linear, places in sites.values():
        if skip is not None and any(skip(qualified) for _, _, qualified in places):
            continue
        replacement = Int8DynamicLinear.from_linear(linear, per_token=per_token, reduce_range=reduce_range)
        for parent, child_name, _ in places:
            setattr(parent, child_name, replacement)
        count += 1
    return count
