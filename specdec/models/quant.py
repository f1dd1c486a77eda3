"""int8 dynamic W8A8 linear layers for CPU, on fbgemm through torch's quantized ops.

`Int8DynamicLinear` keeps the weight as symmetric int8 with one scale per output channel, packed once
for fbgemm, and quantizes activations on the fly with one scale per row (token). `quantize_int8_`
swaps every `nn.Linear` of a model for one, in place.

Activations, per row. fbgemm's `quantized::linear_dynamic` quantizes the whole input with one
asymmetric uint8 scale taken from its min and max, so one loud row (a BOS token with massive
activations, one row of a prefill) coarsens every other row, and every row's result depends on what
else is in the batch. Instead each row is divided by its own max|x| (so it lies in [-1, 1]) and fed to
`quantized::linear_with_input_q_dq_qweight_dq_output_fp32` with a FIXED activation grid (scale 1/64,
zero point 64: q = round(64 x/max|x|) + 64 in [0, 128]); the output row is multiplied back by max|x|,
which is exact in real arithmetic since the layer is linear in each row. So the quantization of a row
depends on that row alone: a row's output is bitwise the same whatever batch it is computed in (tested),
which fp32 MKL does not promise, and which keeps speculative verification consistent with plain decode.
Cost: five small elementwise ops around the GEMM (about 15 us per call, see the 1-thread table).

Seven-bit activations (`reduce_range=True`, the default). Without AVX-512 VNNI (the AVX2 machines this
project targets) fbgemm multiplies uint8 x int8 with `vpmaddubsw`, which adds two products into a
saturating int16: 2*255*127 overflows it and the result is silently wrong (measured: up to 10% off with
FBGEMM_ENABLE_INSTRUCTIONS=AVX2). Activations in [0, 128] keep 2*128*127 < 32767: exact on every CPU.
The step is max|x|/64 per row; the relative output error on Gaussian data is about 1.7%
(tests/models/test_quant.py). `reduce_range=False` uses scale 1/127, zero point 128 (8 bits, ~1.1%), and
is exact only on VNNI CPUs.

Measured with bench/int8_linear.py on a 2-core AMD EPYC that HAS AVX-512 VNNI (shared/NOTES.md's numbers
are from an AVX2-only one), torch 2.13, ms per call, median (fastest) of the reps; "stack" = all 120
linears of the 30 layers, "head" = the 576->49152 LM head. Other engineers' CPU-bound jobs ran throughout;
with 2 threads every OpenMP region then waits for a scheduler slice now and then, which inflates the
medians (and the per-row head, which has two such regions, the GEMM and the row rescale); the 1-thread
run below is the steadier comparison.

    python bench/int8_linear.py --reps 25

| rows | stack fp32 | stack int8 (this) | stack fbgemm per-tensor | stack _int_mm | head fp32 | head int8 (this) | head per-tensor |
|---|---|---|---|---|---|---|---|
| 1 | 43.3 (38.3) | 14.4 (8.7) | 10.7 (6.4) | 16.8 (12.8) | 9.5 (9.0) | 1.3 (1.0) | 0.8 (0.7) |
| 4 | 464 (99.3) | 58.9 (16.8) | 42.0 (9.9) | 62.1 (26.3) | 36.0 (32.1) | 16.1 (14.6) | 8.0 (8.0) |
| 8 | 248 (97.2) | 32.6 (19.3) | 20.0 (15.6) | 73.2 (35.1) | 44.8 (40.0) | 15.7 (14.4) | 8.9 (8.0) |
| 16 | 540 (275) | 142 (37.8) | 139 (35.4) | 283 (85.2) | 79.1 (71.9) | 22.9 (20.5) | 13.6 (12.0) |

    python bench/int8_linear.py --threads 1 --reps 20 --only "fp32,int8 per-token (*),fbgemm per-tensor,_int_mm per-token"

| rows | stack fp32 | stack int8 (this) | stack fbgemm per-tensor | stack _int_mm | head fp32 | head int8 (this) | head per-tensor |
|---|---|---|---|---|---|---|---|
| 1 | 53.5 (47.6) | 12.9 (8.4) | 11.1 (7.6) | 26.4 (22.2) | 14.5 (10.8) | 1.6 (1.4) | 1.6 (1.4) |
| 4 | 68.5 (61.9) | 13.2 (12.8) | 11.1 (7.0) | 30.3 (25.1) | 24.3 (15.0) | 1.6 (1.4) | 1.4 (1.3) |
| 8 | 69.2 (50.6) | 12.5 (11.0) | 9.6 (9.0) | 31.4 (23.1) | 30.0 (17.0) | 2.2 (2.1) | 2.0 (1.8) |
| 16 | 106 (67.4) | 33.4 (16.8) | 25.7 (14.3) | 55.7 (29.3) | 36.5 (22.5) | 3.8 (3.7) | 3.9 (3.4) |

Error vs fp32 (gate_up, 16 Gaussian rows, one 100x louder): this 1.6% on the quiet rows and a row gives
the same bits alone as in the batch; fbgemm per-tensor 99% on the quiet rows.

Kernels tried and dropped (same bench; `--slow` adds qlinear_pointwise and torchao):
- `quantized::linear_dynamic` as is: per-tensor scale, so a row 100x louder than the others leaves them
  with ~99% error (7-bit) or ~72% (8-bit), and a row's result depends on its batch; it is only ~15 us
  per call faster than the per-row scheme.
- `torch._int_mm` (oneDNN s8 x s8, per-row scales by hand; true 8-bit per row): slower at every row
  count, and with ONEDNN_MAX_CPU_ISA=AVX2 not exact either (2.4% error instead of 1.0%).
- `quantized::linear_dynamic` on a weight prepacked by the "onednn" engine: per-tensor, and slower.
- `onednn::qlinear_pointwise` (what inductor emits), uint8 rows by hand: slower than fbgemm; with int8
  (signed) rows it takes a path that is ~100x slower.
- `_weight_int8pack_mm` (weight-only int8, fp32 activations): slower than fp32 from 4 rows on.
- torchao 0.18 `Int8DynamicActivationInt8WeightConfig` (per-row symmetric int8, eager): slower
  than fp32 here (2-30x), and it warns at import. Not a dependency.

Deprecation: torch 2.13 deprecates quantized tensors (torch.qint8, pytorch issue 184982) and warns once
per process when one is created. fbgemm's prepack only takes a qint8 tensor, so `from_linear` builds one
and silences exactly that warning around the call; `quantize_dynamic` is not used. When torch removes
qint8, `from_linear` will fail loudly; the replacement then is `torch._int_mm` (see the bench).

CPU only, inference only (no autograd through the quantized op). The packed weight is not in
`state_dict` (only the bias is): quantize after loading the float weights. Pickle is not supported.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from specdec.config import WEIGHT_BITS
from specdec.errors import ConfigError

if TYPE_CHECKING:
    from specdec.models.llama import LlamaModel

__all__ = ["Int8DynamicLinear", "finish_int8_serving", "int8_serving_policy", "quantize_drafter_int8_",
           "quantize_int8_", "quantize_model_int8_", "quantize_weight_per_channel"]

# Rows whose max |x| is below this are scaled as if it were this (an all-zero row stays zero, no 0/0).
_MIN_ROW_SCALE = 1e-30
# Fixed activation grids for rows scaled into [-1, 1]: (scale, zero point) -> q in [0, 128] or [1, 255].
ROW_GRID_7BIT = (1.0 / 64.0, 64)
ROW_GRID_8BIT = (1.0 / 127.0, 128)


def quantize_weight_per_channel(weight: Tensor, bits: int = 8) -> tuple[Tensor, Tensor]:
    """Symmetric int8 (or int7: `bits=7`) per output channel: returns (int8 [out, in], float32 scales [out]).

    With L = 2 ** (bits - 1) - 1 (127, or 63): scale = max|w_row| / L and q = round_half_even(w / scale) in
    [-L, L]; an all-zero row gets scale 1 and q = 0.
    """
    levels = float(2 ** (bits - 1) - 1)
    w = weight.detach().to(torch.float32)
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / levels, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-levels, levels).to(torch.int8)
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
    """y = x @ W.T + b with W int8 per output channel and x quantized per row at run time.

    Takes [..., in_features] in float32 (bf16/fp16 are cast in, and the output cast back); returns
    [..., out_features]. Build it with `from_linear`. `per_token=False` gives fbgemm's own per-tensor
    dynamic scheme instead (one scale from the whole input's min/max; faster by a few us, batch-dependent).
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
        self._grid = ROW_GRID_7BIT if reduce_range else ROW_GRID_8BIT
        self._row_op = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32.default
        self._dyn_op = torch.ops.quantized.linear_dynamic.default

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
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if in_dtype != torch.float32:
            x2 = x2.to(torch.float32)
        if self.per_token:
            s = x2.abs().amax(dim=1, keepdim=True).clamp_min_(_MIN_ROW_SCALE)
            y = self._row_op(x2 / s, self._grid[0], self._grid[1], self._packed)
            bias = self.bias
            y = y.mul_(s) if bias is None else torch.addcmul(bias, y, s)
        else:
            y = self._dyn_op(x2, self._packed, self.reduce_range)
        if x.dim() != 2:
            y = y.view(*x.shape[:-1], self.out_features)
        return y if in_dtype == torch.float32 else y.to(in_dtype)

    def forward_unit_rows(self, u: Tensor) -> Tensor:
        """`(u @ W.T)` for float32 rows `u [T, in]` already divided by their max |x| (so in [-1, 1]), without
        the bias: the caller multiplies the rows back by their scale (see specdec/models/fast_path.py).
        Only for `per_token` layers."""
        return self._row_op(u, self._grid[0], self._grid[1], self._packed)

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
    make: Callable[[nn.Linear], nn.Module] | None = None,
) -> int:
    """Replace every `nn.Linear` under `module` (exact type; subclasses keep their own forward) in place.

    `skip(qualified_name)` returning True keeps that linear in float. Returns how many Linear modules were
    replaced (a module reached under two names counts once and gets one replacement). Weights shared
    with other modules (a tied LM head and its nn.Embedding) are read, not changed: the embedding keeps
    its float weight and the head gets its own int8 copy. `module` itself is not replaced when it is a
    Linear: wrap it first. `make(linear)` builds the replacement instead of Int8DynamicLinear (QLinear).
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
        replacement = (make(linear) if make is not None else
                       Int8DynamicLinear.from_linear(linear, per_token=per_token, reduce_range=reduce_range))
        for parent, child_name, _ in places:
            setattr(parent, child_name, replacement)
        count += 1
    return count


def quantize_drafter_int8_(module: nn.Module) -> int:
    """A drafter's own linears (a draft model, an EAGLE or Medusa head, a reduced-vocabulary LM head) in int8 the
    way the target's are: QLinear, our exact-integer kernels (VNNI where the CPU has it), where the compiled CPU
    kernels serve float32 CPU weights and the layer's width suits them; fbgemm's Int8DynamicLinear elsewhere.

    Drafters used fbgemm before: at the one to eight rows a draft step feeds it, its linears took 68 us a call
    for EAGLE's 576-wide layers, most of a 1.5 ms draft depth. Returns how many linears were replaced."""
    from specdec.kernels import cpu as cpu_kernels
    from specdec.models.qlinear import QLinear

    weight = next(module.parameters(), None)
    own = (weight is not None and weight.dtype == torch.float32 and weight.device.type == "cpu"
           and cpu_kernels.available())

    def make(linear: nn.Linear) -> nn.Module:
        if own and QLinear.supports(linear.in_features):
            return QLinear.from_linear(linear, bits=8)
        return Int8DynamicLinear.from_linear(linear)

    return quantize_int8_(module, make=make)


def quantize_model_int8_(model: "LlamaModel", bits: int = 8, fbgemm: bool = False) -> None:
    """The int8 serving policy for a target model, in place: which linear kernels, and K/V in the precision
    that keeps a row's result the same in any batch.

    With the compiled CPU kernels (specdec/kernels/cpu), every linear becomes a QLinear (our exact-integer
    kernels; `bits=4` gives the decoder layers 4-bit weights, the LM head stays 8-bit; `bits=7` 7-bit weights
    throughout) and attention has a fixed reduction order per row in float32, so the cache stays float32
    (`fbgemm=True` keeps fbgemm's linears with
    them, for comparison: bench/profile_step.py). Without them, the linears are fbgemm's
    (Int8DynamicLinear) and attention runs in the torch reference in float64 (cache and all), whose
    float32-rounded result is the same bits in practice, at about twice the memory traffic.

    Why it matters: int8 activations are quantized per row on a coarse grid, so a 1e-7 difference in an
    attention output (a different batch, a tree instead of one token) can flip a rounding, and the flips
    snowball into different tokens. Either way speculative and batched greedy output equal plain greedy output
    in int8 (tests/engine/test_greedy_equivalence.py).
    """
    make = int8_serving_policy(model, bits, fbgemm)
    quantize_int8_(model, make=make)
    finish_int8_serving(model)


def int8_serving_policy(model: "LlamaModel", bits: int = 8,
                        fbgemm: bool = False) -> Callable[[nn.Linear], nn.Module] | None:
    """The `make` for `quantize_int8_` that `quantize_model_int8_` uses on `model` (None: fbgemm's layers), so
    a loader can quantize a model layer by layer as its weights arrive (specdec/models/quantized_load.py)
    and get the same modules. Raises `ConfigError` for a setting the model cannot serve."""
    from specdec.kernels import cpu as cpu_kernels
    from specdec.models.qlinear import QLinear

    if model.device.type != "cpu":
        raise ConfigError("int8 quantization uses CPU kernels; on CUDA use bfloat16 instead")
    if bits not in WEIGHT_BITS.values():
        raise ConfigError(f"int{bits} is not a supported weight format; choose one of {', '.join(WEIGHT_BITS)}")
    own = model.dtype == torch.float32 and cpu_kernels.available()
    if not own and bits != 8:
        raise ConfigError(f"int{bits} weights need specdec's compiled CPU kernels (a C++ compiler; see "
                          "specdec/kernels/cpu)")
    if not own or fbgemm:
        return None
    head = model.lm_head

    def make(linear: nn.Linear) -> nn.Module:
        if not QLinear.supports(linear.in_features):
            return Int8DynamicLinear.from_linear(linear)
        return QLinear.from_linear(linear, bits=head_bits(bits) if linear is head else bits)

    return make


def head_bits(bits: int) -> int:
    """The LM head's weight bits in the serving policy for decoder layers of `bits`: 4-bit layers keep an 8-bit
    head (the head is 21% of the default model's products, and the most sensitive); int7 is int7 throughout
    (its quality is measured that way: bench/int8_quality.py)."""
    return 8 if bits == 4 else bits


def finish_int8_serving(model: "LlamaModel") -> None:
    """The K/V precision half of the policy: float32 with our kernels (fixed reduction order), else float64.

    Not bfloat16 by default, though the kernels attend over it on AMX and AVX512-BF16 CPUs: measured at stop 49
    on a Zen 4 (bench/results/kv_cache_ab/), plain decode ran 1.05-1.08x faster over it but the hybrid accepted
    fewer tokens of the text it writes (tau 2.01 -> 1.87-1.88 on 30 test prompts), so speculation's gain over
    same-cache plain decode fell (1.55-1.56x -> 1.48-1.50x); it cost 0.9% perplexity; and the two kernels round
    differently, where over float32 every x86 CPU gives an int8 prompt the same text. `kv_cache_dtype=
    "bfloat16"` asks for it."""
    from specdec.kernels import cpu as cpu_kernels

    own = model.dtype == torch.float32 and cpu_kernels.available()
    model.config = dataclasses.replace(model.config, kv_cache_dtype=None if own else "float64")
