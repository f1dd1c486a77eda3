"""Int8DynamicLinear and quantize_int8_: the int8 layer against fp32, against a plain-torch model of the
exact scheme fbgemm runs, per-row activation scales, shapes and dtypes, model-wide replacement with a tied
LM head, and no deprecation warning in a fresh process."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from specdec.models.quant import Int8DynamicLinear, quantize_int8_

REPO = Path(__file__).resolve().parents[2]


def _has_vnni() -> bool:
    """fbgemm uses VNNI (no int16 saturation) only if the CPU has it and no env var forces an older ISA."""
    if os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS", "").upper() not in ("", "AVX512_E1", "AVX512_E1_256"):
        return False
    try:
        return "avx512_vnni" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


# ---- A plain-torch model of the scheme, op for op -------------------------------------------------------
# Per row (the default): each row is divided by its max |x| and quantized on a fixed uint8 grid, scale 1/64
# and zero point 64 (7-bit: q in [0, 128]) or 1/127 and 128 (8-bit). Per tensor (fbgemm's linear_dynamic):
# one asymmetric uint8 grid from the whole input's min/max, chosen by quant_utils::ChooseQuantizationParams
# (qmax 127 with reduce_range). Either way q = round_half_even(fma(x, 1/scale, zp)) clamped to [0, 255],
# an exact integer GEMM against the int8 weight, y = (acc * a_scale) * w_scale[c], then times the row's
# max |x| (per row), plus bias.

def plain_weight_quant(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def act_qparams(xmin: float, xmax: float, reduce_range: bool) -> tuple[float, int]:
    qmin, qmax = (0, 127) if reduce_range else (0, 255)
    xmin, xmax = min(xmin, 0.0), max(xmax, 0.0)
    scale = (xmax - xmin) / (qmax - qmin)
    scale_f = torch.tensor(scale, dtype=torch.float32).item()
    if scale_f == 0.0 or math.isinf(1.0 / scale_f):
        scale = 0.1
    assert scale >= 6.1e-5, "the reference does not model fbgemm's small-scale cutoff"
    zp_min, zp_max = qmin - xmin / scale, qmax - xmax / scale
    err_min, err_max = abs(qmin) - abs(xmin / scale), abs(qmax) - abs(xmax / scale)
    zp = zp_min if err_min < err_max else zp_max
    zp = qmin if zp < qmin else qmax if zp > qmax else round(zp)  # round(): half to even, like nearbyint
    return torch.tensor(scale, dtype=torch.float32).item(), int(zp)


def reference(x: torch.Tensor, wq: torch.Tensor, wscale: torch.Tensor, bias, per_token: bool, reduce_range: bool):
    x2 = x.reshape(-1, x.shape[-1]).float()
    if per_token:
        s = x2.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
        x2 = x2 / s
        scale, zp = (1 / 64, 64) if reduce_range else (1 / 127, 128)
        a_scale = torch.tensor(scale, dtype=torch.float32).item()
    else:
        a_scale, zp = act_qparams(x2.min().item(), x2.max().item(), reduce_range)
    inv = torch.tensor(1.0, dtype=torch.float32) / a_scale  # fbgemm: float inverse_scale = 1.f / scale
    # fma in float64 (exact product), one rounding to float32, then round half to even.
    q = torch.round((x2.double() * inv.double() + zp).float()).clamp(0, 255)
    acc = (q.double() - zp) @ wq.double().T  # exact: |acc| < 2**53
    y = acc.float() * a_scale * wscale
    if per_token:
        y = y * s
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], wq.shape[0])


def gaussian_linear(k: int, n: int, bias: bool, seed: int = 0) -> nn.Linear:
    g = torch.Generator().manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * 0.05)
        if bias:
            lin.bias.copy_(torch.randn(n, generator=g))
    return lin


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y - ref).norm() / ref.norm()).item()


# ---- the layer -------------------------------------------------------------------------------------------

def test_weight_is_symmetric_int8_per_output_channel():
    lin = gaussian_linear(64, 48, bias=True)
    with torch.no_grad():
        lin.weight[5].zero_()  # an all-zero channel must not divide by zero
        lin.weight[7, 3] = 10.0  # one outlier only coarsens its own channel
    q = Int8DynamicLinear.from_linear(lin)
    wq, scale = plain_weight_quant(lin.weight.detach())
    assert torch.equal(q.weight_int8, wq)
    torch.testing.assert_close(q.weight_scale, scale, rtol=0, atol=0)
    assert q.weight_int8.abs().max().item() == 127 and q.weight_int8[5].abs().max().item() == 0
    assert q.weight_scale[7].item() == pytest.approx(10.0 / 127)
    assert q.weight_scale[6].item() < 0.3 / 127


def test_from_linear_does_not_touch_the_linear():
    lin = gaussian_linear(32, 16, bias=True)
    before = (lin.weight.detach().clone(), lin.bias.detach().clone())
    q = Int8DynamicLinear.from_linear(lin)
    assert torch.equal(lin.weight, before[0]) and torch.equal(lin.bias, before[1])
    assert q.bias is not None and q.bias.data_ptr() != lin.bias.data_ptr()


PAIRS = [(576, 192), (1536, 576)]


@pytest.mark.parametrize("rows", [1, 4, 16, 37])
@pytest.mark.parametrize("per_token", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_plain_torch_model_of_the_scheme(rows, per_token, bias):
    """Bit-level agreement up to float32 rounding: one activation off by one quantum would move outputs by
    about 1e-3 of their scale, 100x the tolerance."""
    for k, n in PAIRS:
        lin = gaussian_linear(k, n, bias, seed=rows)
        q = Int8DynamicLinear.from_linear(lin, per_token=per_token)
        # Rows of very different sizes, so per-row and per-tensor scales really differ.
        g = torch.Generator().manual_seed(100 + rows)
        x = torch.randn(rows, k, generator=g) * torch.logspace(-2, 1, rows)[:, None]
        with torch.inference_mode():
            y = q(x)
        ref = reference(x, q.weight_int8, q.weight_scale, q.bias, per_token, reduce_range=True)
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.skipif(not _has_vnni(), reason="8-bit activations are exact only on AVX-512 VNNI (int16 saturation)")
def test_eight_bit_activations_match_on_vnni():
    lin = gaussian_linear(576, 192, bias=True)
    q = Int8DynamicLinear.from_linear(lin, reduce_range=False)
    x = torch.randn(8, 576)
    ref = reference(x, q.weight_int8, q.weight_scale, q.bias, True, reduce_range=False)
    torch.testing.assert_close(q(x), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.parametrize("k,n", [(576, 576), (1536, 576)])
def test_close_to_fp32_on_gaussian_data(k, n):
    """Error budget: weights round to steps of max|w_c|/127 and activations to steps of max|x_r|/64; rounding
    noise has variance step**2/12, and the max of K Gaussian entries is ~3.1-3.4 sigma. So the relative
    output error is about sqrt((3.3/127)**2 + (3.3/64)**2) / sqrt(12) = 1.7%. Allow 2.5%; below 0.5% the
    layer is not quantizing what it claims to."""
    lin = gaussian_linear(k, n, bias=False, seed=k)
    q = Int8DynamicLinear.from_linear(lin)
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        err = rel_err(q(x), lin(x))
    assert 0.005 < err < 0.025, err


def test_per_token_scales_isolate_a_loud_row():
    """A row 1000x louder than the others (a BOS-like token) must not coarsen the others' quantization."""
    lin = gaussian_linear(576, 576, bias=False)
    x = torch.randn(8, 576, generator=torch.Generator().manual_seed(2))
    x[0] *= 1000
    per_row = Int8DynamicLinear.from_linear(lin)
    per_tensor = Int8DynamicLinear.from_linear(lin, per_token=False)
    with torch.inference_mode():
        ref = lin(x)[1:]
        assert rel_err(per_row(x)[1:], ref) < 0.025
        assert rel_err(per_tensor(x)[1:], ref) > 0.2  # what plain fbgemm would have done
        # a quiet row is as accurate in that batch as alone
        assert rel_err(per_row(x[1:2]), ref[:1]) < 0.025
        assert rel_err(per_row(x)[1:2], ref[:1]) < 0.025


def test_a_row_gives_the_same_bits_in_any_batch():
    """Per-row quantization on a fixed grid: row i's output does not depend on the other rows."""
    lin = gaussian_linear(576, 960, bias=True)
    q = Int8DynamicLinear.from_linear(lin)
    x = torch.randn(16, 576) * torch.logspace(-1, 2, 16)[:, None]
    with torch.inference_mode():
        full = q(x)
        for i in (0, 5, 15):
            assert torch.equal(q(x[i : i + 1]), full[i : i + 1])
        assert torch.equal(q(x[3:11]), full[3:11])
        assert torch.equal(q(x.view(4, 4, 576)), full.view(4, 4, 960))
        # fbgemm's own per-tensor scheme does not have this property
        pt = Int8DynamicLinear.from_linear(lin, per_token=False)
        assert not torch.equal(pt(x[:1]), pt(x)[:1])


def test_shapes_and_layouts():
    lin = gaussian_linear(64, 40, bias=True)
    q = Int8DynamicLinear.from_linear(lin)
    x = torch.randn(3, 5, 64)
    with torch.inference_mode():
        y3 = q(x)
        assert y3.shape == (3, 5, 40) and y3.dtype == torch.float32
        torch.testing.assert_close(y3.reshape(15, 40), q(x.reshape(15, 64)), rtol=0, atol=0)
        assert q(torch.randn(64)).shape == (40,)
        assert q(torch.randn(2, 3, 4, 64)).shape == (2, 3, 4, 40)
        empty = q(torch.randn(0, 64))
        assert empty.shape == (0, 40)
        zeros = q(torch.zeros(2, 64))
        torch.testing.assert_close(zeros, lin.bias.detach().expand(2, 40), rtol=0, atol=0)
        xt = torch.randn(64, 6).T  # non-contiguous
        torch.testing.assert_close(q(xt), q(xt.contiguous()), rtol=0, atol=0)
        with pytest.raises(ValueError, match="expected"):
            q(torch.randn(2, 63))


def test_works_without_inference_mode_and_under_no_grad():
    lin = gaussian_linear(32, 16, bias=True)
    q = Int8DynamicLinear.from_linear(lin)
    x = torch.randn(4, 32)
    with torch.inference_mode():
        a = q(x)
    with torch.no_grad():
        b = q(x)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(q(x), a, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_are_cast_in_and_out(dtype):
    lin = gaussian_linear(128, 64, bias=True)
    q = Int8DynamicLinear.from_linear(lin)
    x = torch.randn(4, 128).to(dtype)
    with torch.inference_mode():
        y = q(x)
        assert y.dtype == dtype
        torch.testing.assert_close(y, q(x.float()).to(dtype), rtol=0, atol=0)


def test_half_precision_linear_is_quantized_from_its_values():
    lin = gaussian_linear(64, 32, bias=True).to(torch.bfloat16)
    q = Int8DynamicLinear.from_linear(lin)
    x = torch.randn(4, 64)
    with torch.inference_mode():
        assert rel_err(q(x), lin.float()(x)) < 0.025


# ---- quantize_int8_ --------------------------------------------------------------------------------------

class TinyLM(nn.Module):
    """Embedding, a few blocks of Linears nested in lists and sequentials, and a head tied to the embedding."""

    def __init__(self, vocab: int = 50, hidden: int = 32, tied: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden, 3 * hidden), nn.GELU(), nn.Linear(3 * hidden, hidden, bias=False))
            for _ in range(2)
        )
        self.proj = nn.ModuleDict({"a": nn.Linear(hidden, hidden)})
        self.proj_again = self.proj["a"]  # the same Linear reachable under two names
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(h)
        h = self.proj_again(self.proj["a"](h))
        return self.lm_head(h)


def _linears(m: nn.Module) -> list[str]:
    return [name for name, mod in m.named_modules() if isinstance(mod, nn.Linear)]


def test_quantize_int8_replaces_every_linear_and_keeps_the_tied_embedding():
    torch.manual_seed(0)
    model = TinyLM()
    ids = torch.randint(0, 50, (2, 7))
    emb_param = model.embed.weight
    emb_before = emb_param.detach().clone()
    with torch.inference_mode():
        ref = model(ids)
    n = quantize_int8_(model)
    assert n == 6  # 2 blocks x 2 + proj (counted once) + lm_head
    assert _linears(model) == []
    assert isinstance(model.lm_head, Int8DynamicLinear)
    assert model.proj_again is model.proj["a"]
    # The embedding keeps its float weight, same Parameter, same values; the head has its own int8 copy.
    assert model.embed.weight is emb_param and model.embed.weight.dtype == torch.float32
    assert torch.equal(model.embed.weight, emb_before)
    assert torch.equal(model.lm_head.weight_int8, plain_weight_quant(emb_before)[0])
    with torch.inference_mode():
        out = model(ids)
    assert out.shape == ref.shape
    assert rel_err(out, ref) < 0.05
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean().item() > 0.9


def test_quantize_int8_skip_and_count():
    model = TinyLM()
    n = quantize_int8_(model, skip=lambda name: name == "lm_head" or name.startswith("blocks.1."))
    assert n == 3
    assert _linears(model) == ["blocks.1.0", "blocks.1.2", "lm_head"]
    assert model.lm_head.weight is model.embed.weight  # still tied: it was left alone
    # skipping a shared Linear under either of its names keeps it float under both
    model = TinyLM()
    assert quantize_int8_(model, skip=lambda name: name == "proj_again") == 5
    assert type(model.proj["a"]) is nn.Linear and model.proj_again is model.proj["a"]
    assert quantize_int8_(model) == 1 and _linears(model) == []
    assert quantize_int8_(model) == 0


def test_quantize_int8_leaves_linear_subclasses_alone():
    class Custom(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    model = nn.Sequential(nn.Linear(8, 8), Custom(8, 8))
    assert quantize_int8_(model) == 1
    assert isinstance(model[0], Int8DynamicLinear) and type(model[1]) is Custom


# ---- fresh processes: no warnings; AVX2 kernels (the target machines) ------------------------------------

def _run(code: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(code)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )


def test_no_warning_at_import_or_use_in_a_fresh_process():
    proc = _run("""
        import torch
        from torch import nn
        from specdec.models.quant import Int8DynamicLinear, quantize_int8_
        m = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 16, bias=False))
        assert quantize_int8_(m) == 2
        with torch.inference_mode():
            m(torch.randn(3, 64))
        m(torch.randn(64).bfloat16())
        m[0].weight_int8, m[0].weight_scale
        Int8DynamicLinear.from_linear(nn.Linear(64, 8), per_token=False)(torch.randn(2, 64))
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_exact_with_avx2_kernels():
    """Forces fbgemm onto its AVX2 kernels (int16 pair sums, the path of CPUs without VNNI): the 7-bit
    activations must still give the exact scheme."""
    code = """
        import torch
        import sys
        sys.path.insert(0, "tests/models")
        from test_quant import reference, gaussian_linear
        from specdec.models.quant import Int8DynamicLinear
        for per_token in (True, False):
            lin = gaussian_linear(1536, 576, bias=True)
            q = Int8DynamicLinear.from_linear(lin, per_token=per_token)
            # all-positive, large rows: the worst case for int16 pair sums
            x = torch.rand(16, 1536, generator=torch.Generator().manual_seed(3)) * 4 + 1
            x[::2] *= -1
            with torch.inference_mode():
                y = q(x)
            ref = reference(x, q.weight_int8, q.weight_scale, q.bias, per_token, reduce_range=True)
            torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
        print("ok")
    """
    proc = _run(code, {"FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
