// Fused elementwise kernels of the CPU decode path: one pass over a row instead of five to ten torch ops.
//
// Every kernel works row by row with loops that depend only on the row length, so a row's result does not
// depend on the other rows of the batch (see vec.h). The torch equivalents, with the same arguments, are in
// specdec/kernels/reference.py; tests/kernels/test_cpu_kernels.py holds the two against each other.
//
// Each producer writes its output row h in the form its consumer takes (`mode`):
//   0 float:    [h]                        for a float linear
//   1 rowscale: [h / max|h|, max|h| [T,1]] for Int8DynamicLinear (fbgemm): it quantizes the row on a fixed
//               grid and its output row is multiplied back by max|h|, which the *next* kernel does (`scale`)
//   2 q8:       [q int8, s [T,1], gsum [T, H/32]] for QLinear (qlinear.cpp): q = round(h * 127 / max|h|),
//               s = max|h| / 127, gsum = sums of q over each group of 32 (for int4 weights' offsets)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "isa.h"
#include "ops.h"
#include "vec.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__)
#define SPECDEC_WIDE_SILU 1
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq")
namespace specdec {
namespace wide_silu {
#include "vec16.h"

// silu(g) * u (g and u times s first where s is given) over the row's first n / 16 * 16 elements, sixteen at a
// time: the eight-lane loop's operations element by element, so the same bits; returns where it stopped.
// Why: the exps of the gate are most of this kernel, and a tree step runs it once a row and layer.
int64_t silu_mul16(const float* g, const float* u, const float* s, float* o, int64_t n) {
  const __m512 sv = _mm512_set1_ps(s ? *s : 1.0f), one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 gv = _mm512_loadu_ps(g + i), uv = _mm512_loadu_ps(u + i);
    if (s) {
      gv = _mm512_mul_ps(gv, sv);
      uv = _mm512_mul_ps(uv, sv);
    }
    const __m512 e = vexp16(_mm512_xor_ps(gv, sign));
    _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, e)), uv));
  }
  return i;
}

// The largest |h| over the row's first n / 16 * 16 elements (n >= 16), sixteen at a time; returns where it stopped
// in `stop`. A maximum is exact: any grouping gives the eight-lane loop's value.
float abs_max16(const float* h, int64_t n, int64_t& stop) {
  __m512 m = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(h + i)));
  stop = i;
  return _mm512_reduce_max_ps(m);
}

// The q8 form of a row (n a multiple of 32): q = round(h * inv) to nearest even, as the eight-lane loop rounds
// (the default rounding mode's conversion), and per group of 32 the sum of q. The clamp to [-127, 127] is the
// saturating narrowing's: |h| <= max|h| keeps h * 127 / max|h| within 127.5, so neither changes a value.
// Why: at 1,536 values (silu_mul's row) the eight-lane loop cost about 0.45 us a row, half of silu_mul's.
void quantize_q8_16(const float* h, int64_t n, float inv, int8_t* q, float* gsum) {
  const __m512 iv = _mm512_set1_ps(inv);
  for (int64_t g = 0; g < n / 32; ++g) {
    const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(h + 32 * g), iv));
    const __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(h + 32 * g + 16), iv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * g), _mm512_cvtsepi32_epi8(a));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * g + 16), _mm512_cvtsepi32_epi8(b));
    gsum[g] = static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(a, b)));
  }
}

}  // namespace wide_silu
}  // namespace specdec
#pragma GCC pop_options
#endif

namespace specdec {
namespace {

constexpr float kMinRowScale = 1e-30f;  // as specdec.models.quant._MIN_ROW_SCALE
constexpr int64_t kGrain = 8;           // rows per parallel task
constexpr int64_t kGroup = 32;          // q8 group of gsum (and of int4 weights)

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), name, " must be [T, H] float32, contiguous");
}

const float* scale_ptr(const c10::optional<at::Tensor>& scale, int64_t rows) {
  if (!scale.has_value() || !scale->defined()) return nullptr;
  TORCH_CHECK(scale->scalar_type() == at::kFloat && scale->is_contiguous() && scale->numel() == rows,
              "a row scale must be [T, 1] float32");
  return scale->data_ptr<float>();
}

// `wide`: sixteen lanes first (AVX-512; a maximum is exact, so the same value).
float abs_max(const float* h, int64_t n, bool wide) {
  vf m = splat(0.0f);
  int64_t i = 0;
#if defined(SPECDEC_WIDE_SILU)
  if (n >= 16 && wide) m = splat(wide_silu::abs_max16(h, n, i));
#else
  (void)wide;
#endif
  for (; i + kLanes <= n; i += kLanes) {
    vf v = load(h + i);
    m = vmax(m, v < 0 ? -v : v);
  }
  float mx = hmax(m);
  for (; i < n; ++i) mx = std::fabs(h[i]) > mx ? std::fabs(h[i]) : mx;
  return mx > kMinRowScale ? mx : kMinRowScale;
}

// Where a producer's rows go, in the consumer's form.
struct Output {
  int mode;
  int64_t n;
  float* h = nullptr;    // mode 0, 1: [T, n] float
  float* scale = nullptr;  // mode 1, 2: [T]
  int8_t* q = nullptr;   // mode 2: [T, n]
  float* gsum = nullptr;  // mode 2: [T, n / 32]
  std::vector<at::Tensor> tensors;

  bool wide = isa::avx512();  // the sixteen-lane max|h| and quantization (the same bits)

  Output(int mode_, int64_t rows, int64_t n_, const at::TensorOptions& opt) : mode(mode_), n(n_) {
    TORCH_CHECK(mode >= 0 && mode <= 2, "mode must be 0 (float), 1 (rowscale) or 2 (q8)");
    if (mode < 2) {
      tensors.push_back(at::empty({rows, n}, opt));
      h = tensors.back().data_ptr<float>();
    } else {
      TORCH_CHECK(n % kGroup == 0, "q8 output needs a width divisible by 32");
      tensors.push_back(at::empty({rows, n}, opt.dtype(at::kChar)));
      q = tensors.back().data_ptr<int8_t>();
    }
    if (mode > 0) {
      tensors.push_back(at::empty({rows, 1}, opt));
      scale = tensors.back().data_ptr<float>();
    }
    if (mode == 2) {
      tensors.push_back(at::empty({rows, n / kGroup}, opt));
      gsum = tensors.back().data_ptr<float>();
    }
  }

  // Row buffer the producer writes h into: the output itself for float forms, else `scratch`.
  float* row(int64_t r, std::vector<float>& scratch) {
    if (mode < 2) return h + r * n;
    scratch.resize(n);
    return scratch.data();
  }

  void finish(int64_t r, float* hr) {
    if (mode == 0) return;
    const float mx = abs_max(hr, n, wide);
    if (mode == 1) {
      const vf d = splat(mx);
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) store(hr + i, load(hr + i) / d);
      for (; i < n; ++i) hr[i] = hr[i] / mx;
      scale[r] = mx;
      return;
    }
    const float inv = 127.0f / mx;
    int8_t* qr = q + r * n;
    float* gs = gsum + r * (n / kGroup);
    int64_t g = 0;
#if defined(SPECDEC_WIDE_SILU)
    if (wide) {
      wide_silu::quantize_q8_16(hr, n, inv, qr, gs);
      g = n / kGroup;
    }
#endif
#if defined(__AVX2__)
    // The loop below, eight values at a time: the same product, round-to-nearest-even and clamp, so the same
    // bits (nearbyint rounds that way under the default rounding mode, as _mm256_round_ps does here).
    const __m256 iv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (; g < n / kGroup; ++g) {
      __m256i part[4];
      for (int t = 0; t < 4; ++t) {
        __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(hr + g * kGroup + 8 * t), iv),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        part[t] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
      }
      // int32 -> int8 (values are in [-127, 127]: the saturating packs are exact); packs work per 128-bit
      // lane, so the permute restores element order.
      const __m256i w16 = _mm256_packs_epi32(part[0], part[1]), x16 = _mm256_packs_epi32(part[2], part[3]);
      const __m256i b8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w16, x16),
                                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qr + g * kGroup), b8);
      const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(part[0], part[1]), _mm256_add_epi32(part[2], part[3]));
      gs[g] = static_cast<float>(hsum_i32(sum));
    }
#endif
    for (; g < n / kGroup; ++g) {
      int32_t total = 0;
      for (int64_t i = g * kGroup; i < (g + 1) * kGroup; ++i) {
        float v = std::nearbyint(hr[i] * inv);
        v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
        qr[i] = static_cast<int8_t>(v);
        total += qr[i];
      }
      gs[g] = static_cast<float>(total);
    }
    scale[r] = mx / 127.0f;
  }
};

// x (+= residual * residual_scale, in place) -> weight * (x * rsqrt(mean(x^2) + eps)), in `mode`'s form.
std::vector<at::Tensor> rms_norm(at::Tensor x, const at::Tensor& weight, double eps, int64_t mode,
                                 const c10::optional<at::Tensor>& residual,
                                 const c10::optional<at::Tensor>& residual_scale) {
  check_rows(x, "x");
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.numel() == n, "weight must be [H] float32");
  const float* res = nullptr;
  if (residual.has_value() && residual->defined()) {
    check_rows(*residual, "residual");
    TORCH_CHECK(residual->sizes() == x.sizes(), "residual must have x's shape");
    res = residual->data_ptr<float>();
  }
  const float* rs = scale_ptr(residual_scale, rows);
  Output out(static_cast<int>(mode), rows, n, x.options());
  float* xp = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t r = begin; r < end; ++r) {
      float* xr = xp + r * n;
      float* o = out.row(r, scratch);
      if (res) {
        const float* y = res + r * n;
        int64_t i = 0;
        if (rs) {
          const vf s = splat(rs[r]);
          for (; i + kLanes <= n; i += kLanes) store(xr + i, fma(load(y + i), s, load(xr + i)));
          for (; i < n; ++i) xr[i] = fma1(y[i], rs[r], xr[i]);
        } else {
          for (; i + kLanes <= n; i += kLanes) store(xr + i, load(xr + i) + load(y + i));
          for (; i < n; ++i) xr[i] = xr[i] + y[i];
        }
      }
      vf acc = splat(0.0f);
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) {
        vf v = load(xr + i);
        acc = fma(v, v, acc);
      }
      float sumsq = hsum(acc);
      for (; i < n; ++i) sumsq = fma1(xr[i], xr[i], sumsq);
      const float inv = 1.0f / std::sqrt(sumsq / static_cast<float>(n) + e);
      const vf iv = splat(inv);
      for (i = 0; i + kLanes <= n; i += kLanes) store(o + i, load(w + i) * (load(xr + i) * iv));
      for (; i < n; ++i) o[i] = w[i] * (xr[i] * inv);
      out.finish(r, o);
    }
  });
  return out.tensors;
}

// [gate | up] (times a row scale) -> silu(gate) * up, in `mode`'s form.
std::vector<at::Tensor> silu_mul(const at::Tensor& gate_up, const c10::optional<at::Tensor>& scale, int64_t mode) {
  check_rows(gate_up, "gate_up");
  const int64_t rows = gate_up.size(0), n = gate_up.size(1) / 2;
  TORCH_CHECK(gate_up.size(1) == 2 * n, "gate_up must have an even width");
  const float* s = scale_ptr(scale, rows);
  Output out(static_cast<int>(mode), rows, n, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  const bool wide = isa::avx512();
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gp + r * 2 * n;
      const float* u = g + n;
      float* o = out.row(r, scratch);
      const vf sv = splat(s ? s[r] : 1.0f);
      const vf one = splat(1.0f);
      int64_t i = 0;
#if defined(SPECDEC_WIDE_SILU)
      if (wide) i = wide_silu::silu_mul16(g, u, s ? s + r : nullptr, o, n);
#endif
      for (; i + kLanes <= n; i += kLanes) {
        vf gv = load(g + i), uv = load(u + i);
        if (s) {
          gv = gv * sv;
          uv = uv * sv;
        }
        store(o + i, gv / (one + vexp(-gv)) * uv);
      }
      for (; i < n; ++i) {
        float gv = g[i], uv = u[i];
        if (s) {
          gv = gv * s[r];
          uv = uv * s[r];
        }
        o[i] = gv / (1.0f + sexp(-gv)) * uv;
      }
      out.finish(r, o);
    }
  });
  return out.tensors;
}

// Rows of x (flattened to [T, H]) in `mode`'s form (1 or 2): the input of an int8 linear.
std::vector<at::Tensor> quantize(const at::Tensor& x, int64_t mode) {
  at::Tensor flat = x.reshape({x.size(0), -1}).contiguous();
  check_rows(flat, "x");
  TORCH_CHECK(mode == 1 || mode == 2, "quantize: mode must be 1 (rowscale) or 2 (q8)");
  const int64_t rows = flat.size(0), n = flat.size(1);
  Output out(static_cast<int>(mode), rows, n, flat.options());
  const float* xp = flat.data_ptr<float>();
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t r = begin; r < end; ++r) {
      float* o = out.row(r, scratch);
      std::memcpy(o, xp + r * n, n * sizeof(float));
      out.finish(r, o);
    }
  });
  return out.tensors;
}

// A float's bfloat16 bits, rounded to nearest even (torch's rounding; NaN stays NaN).
inline uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Rotate one head vector (rotate-half layout: pairs (i, i + D/2)) by cos/sin rows into dst.
inline void rotate(const float* x, const float* c, const float* s, int64_t d, float* dst) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) dst[i] = fma1(-x[i + half], s[i], x[i] * c[i]);
  for (int64_t i = half; i < d; ++i) dst[i] = fma1(x[i - half], s[i], x[i] * c[i]);
}

// qkv row (times its scale, plus bias) -> rotated q (returned) and rotated k and v written into the cache slots.
at::Tensor rope_kv(const at::Tensor& qkv, const c10::optional<at::Tensor>& scale, const c10::optional<at::Tensor>& bias,
                   const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache,
                   at::Tensor v_cache, const at::Tensor& slot_mapping, int64_t q_heads, int64_t kv_heads) {
  check_rows(qkv, "qkv");
  const int64_t rows = qkv.size(0), width = qkv.size(1);
  const int64_t d = k_cache.size(3);
  TORCH_CHECK(width == (q_heads + 2 * kv_heads) * d && d % 2 == 0, "qkv width does not match the heads");
  const bool bf16 = k_cache.scalar_type() == at::kBFloat16;
  TORCH_CHECK((bf16 || k_cache.scalar_type() == at::kFloat) && v_cache.scalar_type() == k_cache.scalar_type() &&
                  k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.size(2) == kv_heads,
              "caches must be float32 or bfloat16 [blocks, block_size, kv_heads, D], contiguous");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous() && cos.size(1) == d,
              "cos/sin must be [positions, D] float32");
  TORCH_CHECK(positions.scalar_type() == at::kLong && slot_mapping.scalar_type() == at::kLong &&
                  positions.numel() == rows && slot_mapping.numel() == rows,
              "positions and slot_mapping must be [T] int64");
  const float* s = scale_ptr(scale, rows);
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == width, "bias must be [width] float32");
    b = bias->data_ptr<float>();
  }
  const at::Tensor pos = positions.contiguous(), slots = slot_mapping.contiguous();
  const int64_t* pp = pos.data_ptr<int64_t>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  const int64_t max_pos = cos.size(0), num_slots = k_cache.size(0) * k_cache.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(pp[r] >= 0 && pp[r] < max_pos, "position out of range of the rope tables");
    TORCH_CHECK(sl[r] >= 0 && sl[r] < num_slots, "slot out of range of the cache");
  }
  at::Tensor q = at::empty({rows, q_heads, d}, qkv.options());
  const float* xp = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* snp = sin.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* kc = bf16 ? nullptr : k_cache.data_ptr<float>();
  float* vc = bf16 ? nullptr : v_cache.data_ptr<float>();
  uint16_t* kh = bf16 ? reinterpret_cast<uint16_t*>(k_cache.data_ptr<at::BFloat16>()) : nullptr;
  uint16_t* vh = bf16 ? reinterpret_cast<uint16_t*>(v_cache.data_ptr<at::BFloat16>()) : nullptr;
  at::parallel_for(0, rows, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> y(width), kv(kv_heads * d);
    for (int64_t r = begin; r < end; ++r) {
      const float* x = xp + r * width;
      for (int64_t i = 0; i < width; ++i) {
        const float v = s ? x[i] * s[r] : x[i];
        y[i] = b ? v + b[i] : v;
      }
      const float* c = cp + pp[r] * d;
      const float* sn = snp + pp[r] * d;
      for (int64_t h = 0; h < q_heads; ++h) rotate(y.data() + h * d, c, sn, d, qp + (r * q_heads + h) * d);
      const float* v = y.data() + (q_heads + kv_heads) * d;
      if (bf16) {  // a bfloat16 cache: the rotated k and v rounded to nearest even
        for (int64_t h = 0; h < kv_heads; ++h) rotate(y.data() + (q_heads + h) * d, c, sn, d, kv.data() + h * d);
        for (int64_t i = 0; i < kv_heads * d; ++i) {
          kh[sl[r] * kv_heads * d + i] = to_bf16(kv[i]);
          vh[sl[r] * kv_heads * d + i] = to_bf16(v[i]);
        }
        continue;
      }
      float* kd = kc + sl[r] * kv_heads * d;
      float* vd = vc + sl[r] * kv_heads * d;
      for (int64_t h = 0; h < kv_heads; ++h) rotate(y.data() + (q_heads + h) * d, c, sn, d, kd + h * d);
      std::memcpy(vd, v, kv_heads * d * sizeof(float));
    }
  });
  return q;
}

}  // namespace

namespace ops {
std::vector<at::Tensor> rms_norm(at::Tensor x, const at::Tensor& weight, double eps, int64_t mode,
                                 const c10::optional<at::Tensor>& residual,
                                 const c10::optional<at::Tensor>& residual_scale) {
  return specdec::rms_norm(x, weight, eps, mode, residual, residual_scale);
}
std::vector<at::Tensor> silu_mul(const at::Tensor& gate_up, const c10::optional<at::Tensor>& scale, int64_t mode) {
  return specdec::silu_mul(gate_up, scale, mode);
}
std::vector<at::Tensor> quantize(const at::Tensor& x, int64_t mode) { return specdec::quantize(x, mode); }
at::Tensor rope_kv(const at::Tensor& qkv, const c10::optional<at::Tensor>& scale, const c10::optional<at::Tensor>& bias,
                   const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache,
                   at::Tensor v_cache, const at::Tensor& slot_mapping, int64_t q_heads, int64_t kv_heads) {
  return specdec::rope_kv(qkv, scale, bias, positions, cos, sin, k_cache, v_cache, slot_mapping, q_heads, kv_heads);
}
}  // namespace ops
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_cpu, m) {
  m.def("rms_norm(Tensor(a!) x, Tensor weight, float eps, int mode, Tensor? residual, Tensor? residual_scale) -> Tensor[]");
  m.def("silu_mul(Tensor gate_up, Tensor? scale, int mode) -> Tensor[]");
  m.def("quantize(Tensor x, int mode) -> Tensor[]");
  m.def("rope_kv(Tensor qkv, Tensor? scale, Tensor? bias, Tensor positions, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor slot_mapping, int q_heads, int kv_heads) -> Tensor");
  m.impl("rms_norm", c10::DispatchKey::CPU, &specdec::rms_norm);
  m.impl("silu_mul", c10::DispatchKey::CPU, &specdec::silu_mul);
  m.impl("quantize", c10::DispatchKey::CPU, &specdec::quantize);
  m.impl("rope_kv", c10::DispatchKey::CPU, &specdec::rope_kv);
}
