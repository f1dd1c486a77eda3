// int8 x int8 and int4 x int8 linear layers with exact integer dot products, for few rows (decode, trees).
//
// Activations come quantized per row (fused.cpp mode 2): q int8 in [-127, 127] with x ~ q * s.
//   linear_q8: W int8 [N, K] with one scale per output channel:  y = float(sum_k q w) * (s * w_scale) + b
//   linear_q4: W as 4-bit q in [0, 15] per group of 32 along K with a scale d and an offset m per group
//              (w = d q + m, the layout of GGUF's Q4_1; d [N, G] and m transposed [G, N], both float16):
//              y = s * (sum_g d_g sum_{k in g} q w4 + sum_g m_g gsum_g) + b
// The integer sums are exact, so their order cannot matter; the few float operations around them have a
// fixed order per output element. Hence a row's output is the same bits in any batch and any tiling: the
// batch-invariance the int8 engine needs, by construction. K must be a multiple of 32.
//
// AVX2: s8 x s8 products through vpmaddubsw need one operand unsigned: |q| times w with q's sign moved onto
// w (vpsignb), 2 * 127 * 127 fits int16, so nothing saturates; 4-bit weights are unsigned already.
// 7-bit weights (weight_bits=7, w in [-63, 63]; QLinear bits=7) skip the sign: w + 64 in [1, 127] is the
// unsigned operand, q the signed one (2 * 127 * 127 still fits), and 64 * sum_k q comes off the sum. One vector
// op fewer per 32 products per row (and the add of 64 is shared by the rows): 1.15-1.25x faster at 4-16 rows,
// where this kernel is bound by arithmetic rather than by memory (bench/int8_rows.py).
// AVX-512 VNNI (qlinear_vnni.cpp) and AMX (qlinear_amx.cpp, on a second copy of the weights in its own layout)
// compute the same exact integer dots and the same float steps, so every level of isa.h gives the same bits.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "isa.h"
#include "ops.h"
#include "qlinear_amx.h"
#include "qlinear_vnni.h"
#include "vec.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace specdec {
namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kColBlock = 64;  // columns per parallel task (their weights stay in cache across rows)

void check_q(const at::Tensor& q, const at::Tensor& s, int64_t k) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous() && q.size(1) == k,
              "q must be [T, K] int8, contiguous");
  TORCH_CHECK(s.scalar_type() == at::kFloat && s.is_contiguous() && s.numel() == q.size(0), "s must be [T, 1] float32");
  TORCH_CHECK(k % kGroup == 0, "K must be a multiple of 32");
}

const float* bias_ptr(const c10::optional<at::Tensor>& bias, int64_t n) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n, "bias must be [N] float32");
  return bias->data_ptr<float>();
}

#if defined(__AVX2__)
// Eight int32 partial sums of 32 products q * w (q, w int8 in [-127, 127]).
inline __m256i dot32_s8(__m256i q_abs, __m256i q, __m256i w) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q_abs, _mm256_sign_epi8(w, q)), _mm256_set1_epi16(1));
}
#endif

// sum_k q[k] w[k] exactly.
inline int32_t dot_s8(const int8_t* q, const int8_t* w, int64_t k) {
  int32_t total = 0;
  for (int64_t i = 0; i < k; ++i) total += static_cast<int32_t>(q[i]) * static_cast<int32_t>(w[i]);
  return total;
}

// Weights are stored in tiles of four output channels (tile.h layout, packed by specdec.kernels.reference):
//   int8: tile t, step j (32 inputs): 128 bytes, channel c's 32 weights at c * 32
//   int4: tile t, group g: 64 bytes, channel c's 16 bytes at c * 16; d: tile t, group g: 4 float16
// so a tile is one sequential stream (DRAM prefetch works best on few streams), and the output channel count is
// padded to a multiple of 4 with zero weights.
constexpr int kTile = 4;

// R rows x one tile of linear_q8, exact int32 sums (any tiling gives the same result). `Seven`: the weights are
// in [-63, 63], summed as sum_k (w + 64) q - 64 sum_k q (`qsum`, per row), one vector op fewer per product.
template <int R, bool Seven>
void q8_tile(const int8_t* q, const int32_t* qsum, int64_t k, const int8_t* wt, const float* s, const float* ws,
             const float* b, int64_t c0, int64_t n, float* y) {
  int32_t dots[R][kTile];
  const int64_t steps = k / kGroup;
#if defined(__AVX2__)
  __m256i acc[R][kTile];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kTile; ++c) acc[r][c] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1), offset = _mm256_set1_epi8(64);
  for (int64_t j = 0; j < steps; ++j) {
    const int8_t* wj = wt + j * kTile * kGroup;
    _mm_prefetch(reinterpret_cast<const char*>(wj + 2 * kTile * k), _MM_HINT_T0);  // two tiles ahead
    _mm_prefetch(reinterpret_cast<const char*>(wj + 2 * kTile * k + 64), _MM_HINT_T0);
    __m256i qv[R], qa[R];
    for (int r = 0; r < R; ++r) {
      qv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * k + j * kGroup));
      if constexpr (!Seven) qa[r] = _mm256_sign_epi8(qv[r], qv[r]);
    }
    for (int c = 0; c < kTile; ++c) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wj + c * kGroup));
      if constexpr (Seven) {
        const __m256i wu = _mm256_add_epi8(wv, offset);
        for (int r = 0; r < R; ++r)
          acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(wu, qv[r]), ones));
      } else {
        for (int r = 0; r < R; ++r) acc[r][c] = _mm256_add_epi32(acc[r][c], dot32_s8(qa[r], qv[r], wv));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kTile; ++c) dots[r][c] = hsum_i32(acc[r][c]) - (Seven ? 64 * qsum[r] : 0);
#else
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kTile; ++c) {
      int32_t total = 0;
      for (int64_t j = 0; j < steps; ++j)
        total += dot_s8(q + r * k + j * kGroup, wt + j * kTile * kGroup + c * kGroup, kGroup);
      dots[r][c] = total;
    }
  (void)qsum;
#endif
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kTile && c0 + c < n; ++c) {
      const float v = static_cast<float>(dots[r][c]) * (s[r] * ws[c0 + c]);
      y[r * n + c] = b ? v + b[c0 + c] : v;
    }
}

// Rows three at a time while the rest allows, then in pairs: a lone row's loop does half the work per weight
// load of a pair's, so 3 rows as a pair and a single cost 1.27x one row, and 1.02x as one tile (bench/int8_rows.py).
template <bool Seven>
void tile_rows(const int8_t* qp, const int32_t* qsum, int64_t rows, int64_t k, const int8_t* wt, const float* sp,
               const float* ws, const float* b, int64_t c, int64_t n, float* yp) {
  for (int64_t r = 0; r < rows;) {
    const int64_t left = rows - r;
    const int group = left == 3 || left >= 5 ? 3 : left >= 2 ? 2 : 1;
    const int8_t* qr = qp + r * k;
    const int32_t* qs = Seven ? qsum + r : nullptr;
    float* yr = yp + r * n + c;
    if (group == 3) q8_tile<3, Seven>(qr, qs, k, wt, sp + r, ws, b, c, n, yr);
    else if (group == 2) q8_tile<2, Seven>(qr, qs, k, wt, sp + r, ws, b, c, n, yr);
    else q8_tile<1, Seven>(qr, qs, k, wt, sp + r, ws, b, c, n, yr);
    r += group;
  }
}

at::Tensor linear_q8(const at::Tensor& q, const at::Tensor& s, const at::Tensor& w, const at::Tensor& w_scale,
                     const c10::optional<at::Tensor>& bias, int64_t weight_bits,
                     const c10::optional<at::Tensor>& w_blocks) {
  TORCH_CHECK(weight_bits == 8 || weight_bits == 7, "weight_bits must be 8 or 7");
  const int64_t n = w_scale.numel(), rows = q.size(0);
  const int64_t tiles = (n + kTile - 1) / kTile;
  TORCH_CHECK(w.scalar_type() == at::kChar && w.is_contiguous() && w.dim() == 2 && w.size(0) == tiles * kTile,
              "w must be int8 tiles [ceil(N / 4) * 4, K] (specdec.kernels.reference.pack_q8)");
  const int64_t k = w.size(1);
  check_q(q, s, k);
  TORCH_CHECK(w_scale.scalar_type() == at::kFloat && w_scale.is_contiguous(), "w_scale must be [N] float32");
  const float* b = bias_ptr(bias, n);
  at::Tensor y = at::empty({rows, n}, s.options());
  const int8_t* qp = q.data_ptr<int8_t>();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = s.data_ptr<float>();
  const float* ws = w_scale.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // The same weights in blocks of 16 channels (pack_q8_blocks), where the kernels run at the "avx512" or "amx"
  // level: AMX tiles (qlinear_amx.cpp) for two rows or more, and VNNI with the channels in lanes
  // (qlinear_vnni.cpp's q8_blocks) otherwise, whose one sequential stream reads a lone row's weights faster
  // than the 4-channel tiles do.
  const bool vnni = isa::avx512();
  const bool blocked = vnni && w_blocks.has_value() && w_blocks->defined();
  const int64_t blocks = (n + amx::kBlock - 1) / amx::kBlock;
  if (blocked)
    TORCH_CHECK(w_blocks->scalar_type() == at::kChar && w_blocks->is_contiguous() && k % amx::kChunk == 0 &&
                    w_blocks->numel() == blocks * amx::kBlock * k,
                "w_blocks must be int8 blocks [ceil(N / 16) * 16 * K] with K divisible by 64 "
                "(specdec.kernels.reference.pack_q8_blocks)");
  if (blocked && rows >= 2 && isa::amx()) {
    const int8_t* ap = w_blocks->data_ptr<int8_t>();
    std::vector<int8_t> padded(qp, qp + rows * k);  // then rows of zeros to whole 16-row tiles
    padded.resize((rows + amx::kBlock - 1) / amx::kBlock * amx::kBlock * k, 0);
    at::parallel_for(0, blocks, kColBlock / amx::kBlock, [&](int64_t begin, int64_t end) {
      amx::q8_rows(padded.data(), rows, k, ap, sp, ws, b, begin, end, n, yp);
    });
    return y;
  }
  constexpr int64_t kTilesPerTask = kColBlock / kTile;
  // the correction term of the VNNI kernels (qlinear_vnni.cpp) and of the 7-bit tiles
  std::vector<int32_t> qsum(vnni || weight_bits == 7 ? rows : 0);
  for (int64_t r = 0; r < static_cast<int64_t>(qsum.size()); ++r)
    for (int64_t i = 0; i < k; ++i) qsum[r] += qp[r * k + i];
  if (blocked) {
    const int8_t* ap = w_blocks->data_ptr<int8_t>();
    at::parallel_for(0, blocks, kColBlock / amx::kBlock, [&](int64_t begin, int64_t end) {
      vnni::q8_blocks(qp, qsum.data(), rows, k, ap, sp, ws, b, begin, end, n, yp);
    });
    return y;
  }
  at::parallel_for(0, (tiles + kTilesPerTask - 1) / kTilesPerTask, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin * kTilesPerTask; t < std::min(tiles, end * kTilesPerTask); ++t) {
      const int8_t* wt = wp + t * kTile * k;
      const int64_t c = t * kTile;
      if (vnni) {
        vnni::q8_rows(qp, qsum.data(), rows, k, wt, sp, ws, b, c, n, yp + c);
        continue;
      }
      if (weight_bits == 7) tile_rows<true>(qp, qsum.data(), rows, k, wt, sp, ws, b, c, n, yp);
      else tile_rows<false>(qp, nullptr, rows, k, wt, sp, ws, b, c, n, yp);
    }
  });
  return y;
}

inline float half_to_float(const at::Half& h) {
#if defined(__F16C__)
  return _cvtsh_ss(h.x);
#else
  return static_cast<float>(h);
#endif
}

// Eight float16 values (`width` of them, the rest 0) as floats.
inline vf half8(const at::Half* p, int64_t width) {
#if defined(__F16C__)
  if (width == kLanes) return (vf)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
  vf v = splat(0.0f);
  for (int64_t l = 0; l < width; ++l) v[l] = static_cast<float>(p[l]);
  return v;
}

// R rows x one tile of sum_g d_g (sum_{k in g} q_k w4_k): per group, the tile's four channels are unpacked once
// and multiplied with each row's int8 activations; each (row, channel) keeps eight float partial sums,
// fma(int dot, d_g, acc) group after group, so its arithmetic is the same whatever R is.
template <int R>
void q4_tile(const int8_t* q, int64_t k, const uint8_t* wt, const at::Half* dt, int64_t c0, int64_t n, float* y) {
  const int64_t groups = k / kGroup;
  float dots[R][kTile];
#if defined(__AVX2__)
  __m256 acc[R][kTile];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kTile; ++c) acc[r][c] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* wg = wt + g * kTile * 16;
    _mm_prefetch(reinterpret_cast<const char*>(wg + 4 * kTile * (k / 2)), _MM_HINT_T0);  // four tiles ahead
    __m256i a[R];
    for (int r = 0; r < R; ++r) a[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * k + g * kGroup));
    for (int c = 0; c < kTile; ++c) {
      const __m256i wq = unpack_q4(wg + c * 16);
      const __m256 dg = _mm256_set1_ps(half_to_float(dt[g * kTile + c]));
      for (int r = 0; r < R; ++r) {
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, a[r]), ones);
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dg, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kTile; ++c) dots[r][c] = hsum((vf)acc[r][c]);
#else
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kTile; ++c) {
      vf acc = splat(0.0f);
      for (int64_t g = 0; g < groups; ++g) {
        vf part = splat(0.0f);
        for (int l = 0; l < kLanes; ++l) {
          int32_t total = 0;
          for (int j = 4 * l; j < 4 * l + 4; ++j) {
            const uint8_t byte = wt[g * kTile * 16 + c * 16 + (j % 16)];
            const int32_t wv = j < 16 ? (byte & 0x0F) : (byte >> 4);
            total += wv * q[r * k + g * kGroup + j];
          }
          part[l] = static_cast<float>(total);
        }
        acc = fma(part, splat(half_to_float(dt[g * kTile + c])), acc);
      }
      dots[r][c] = hsum(acc);
    }
#endif
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kTile && c0 + c < n; ++c) y[r * n + c] = dots[r][c];
}

// y[r, c] = s_r * (y[r, c] + sum_g m_t[g, c] gsum[r, g]) + b_c for columns c0..c1: the offsets, eight columns
// at a time, in group order for every element.
void q4_finish(float* y, int64_t rows, int64_t n, int64_t c0, int64_t c1, const at::Half* m_t, const float* gsum,
               int64_t groups, const float* s, const float* b) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * n;
    const float* gr = gsum + r * groups;
    for (int64_t c = c0; c < c1; c += kLanes) {
      const int64_t width = std::min<int64_t>(kLanes, c1 - c);
      vf off = splat(0.0f);
      for (int64_t g = 0; g < groups; ++g) off = fma(half8(m_t + g * n + c, width), splat(gr[g]), off);
      for (int64_t l = 0; l < width; ++l) {
        const float v = s[r] * (yr[c + l] + off[l]);
        yr[c + l] = b ? v + b[c + l] : v;
      }
    }
  }
}

at::Tensor linear_q4(const at::Tensor& q, const at::Tensor& s, const at::Tensor& gsum, const at::Tensor& w,
                     const at::Tensor& d, const at::Tensor& m_t, const c10::optional<at::Tensor>& bias) {
  const int64_t n = m_t.size(1), rows = q.size(0), tiles = (n + kTile - 1) / kTile;
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous() && w.dim() == 2 && w.size(0) == tiles * kTile,
              "w must be uint8 tiles [ceil(N / 4) * 4, K / 2] (specdec.kernels.reference.pack_q4)");
  const int64_t k = w.size(1) * 2, groups = k / kGroup;
  check_q(q, s, k);
  TORCH_CHECK(d.scalar_type() == at::kHalf && m_t.scalar_type() == at::kHalf && d.is_contiguous() &&
                  m_t.is_contiguous() && d.numel() == tiles * kTile * groups && m_t.size(0) == groups,
              "d must be float16 tiles [ceil(N / 4) * 4, K / 32] and m_t [K / 32, N] float16");
  TORCH_CHECK(gsum.scalar_type() == at::kFloat && gsum.is_contiguous() && gsum.numel() == rows * groups,
              "gsum must be [T, K / 32] float32");
  const float* b = bias_ptr(bias, n);
  at::Tensor y = at::empty({rows, n}, s.options());
  const int8_t* qp = q.data_ptr<int8_t>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* sp = s.data_ptr<float>();
  const float* gp = gsum.data_ptr<float>();
  const at::Half* dp = d.data_ptr<at::Half>();
  const at::Half* mp = m_t.data_ptr<at::Half>();
  float* yp = y.data_ptr<float>();
  constexpr int64_t kTilesPerTask = kColBlock / kTile;
  const bool vnni = isa::avx512();
  std::vector<int8_t> spread(vnni ? rows * 2 * k : 0);  // the VNNI tiles' activation order, built once a call
  if (vnni) vnni::q4_spread(qp, rows, k, spread.data());
  at::parallel_for(0, (tiles + kTilesPerTask - 1) / kTilesPerTask, 1, [&](int64_t begin, int64_t end) {
    const int64_t t0 = begin * kTilesPerTask, t1 = std::min(tiles, end * kTilesPerTask);
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* wt = wp + t * kTile * (k / 2);
      const at::Half* dt = dp + t * kTile * groups;
      const int64_t c = t * kTile;
      if (vnni) {
        vnni::q4_rows(spread.data(), rows, k, wt, dt, c, n, yp + c);
        continue;
      }
      int64_t r = 0;
      for (; r + 2 <= rows; r += 2) q4_tile<2>(qp + r * k, k, wt, dt, c, n, yp + r * n + c);
      for (; r < rows; ++r) q4_tile<1>(qp + r * k, k, wt, dt, c, n, yp + r * n + c);
    }
    q4_finish(yp, rows, n, t0 * kTile, std::min(n, t1 * kTile), mp, gp, groups, sp, b);
  });
  return y;
}

}  // namespace

namespace ops {
at::Tensor linear_q8(const at::Tensor& q, const at::Tensor& s, const at::Tensor& w, const at::Tensor& w_scale,
                     const c10::optional<at::Tensor>& bias, int64_t weight_bits,
                     const c10::optional<at::Tensor>& w_blocks) {
  return specdec::linear_q8(q, s, w, w_scale, bias, weight_bits, w_blocks);
}
at::Tensor linear_q4(const at::Tensor& q, const at::Tensor& s, const at::Tensor& gsum, const at::Tensor& w,
                     const at::Tensor& d, const at::Tensor& m_t, const c10::optional<at::Tensor>& bias) {
  return specdec::linear_q4(q, s, gsum, w, d, m_t, bias);
}
}  // namespace ops
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_cpu, m) {
  m.def("linear_q8(Tensor q, Tensor s, Tensor w, Tensor w_scale, Tensor? bias, int weight_bits=8, "
        "Tensor? w_blocks=None) -> Tensor");
  m.def("linear_q4(Tensor q, Tensor s, Tensor gsum, Tensor w, Tensor d, Tensor m_t, Tensor? bias) -> Tensor");
  m.impl("linear_q8", c10::DispatchKey::CPU, &specdec::linear_q8);
  m.impl("linear_q4", c10::DispatchKey::CPU, &specdec::linear_q4);
}
