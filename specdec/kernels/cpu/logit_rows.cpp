// Reductions over rows of logits, each one pass over a row: the argmax that greedy verification reads, and the
// k largest logits with their softmax probabilities that Token Recycling writes into its matrix.
//
// argmax_rows: torch's argmax takes 35 us a row of 49,152 logits on this CPU (0.3 ms for an 8-node tree) and
// needs the rows in one tensor (a copy); this reads each row once, in four independent chains of compares (one
// chain waits on each compare's latency: 13.6 us a row against about 4), sixteen lanes at a time on AVX-512.
// Ties go to the first index, as torch's. A row holding NaN or +Inf gives -1 (its argmax means nothing; -Inf is
// a token ruled out, as processed rows hold): greedy verification reads the argmax as its check of the logits,
// so health.py's pass over them is not made twice (a tree's rows have left the cache by then: that pass cost
// 0.13 ms of a 7-row step).
//
// top_k_probs: the k largest logits of each row with their softmax probabilities: what Token
// Recycling writes into its matrix after every verified step. torch needs a top-k and a full logsumexp (two
// passes, about 1.2 ms a step for an 8-node tree over a 49,152-token vocabulary on this CPU); here a row is
// read once, and a chunk of eight (sixteen on AVX-512) logits none of which beats the current k-th is skipped
// with one compare; the softmax sum's terms are powers of two by a short polynomial (pow2_terms), sixteen at a
// time on AVX-512.
//
// Order: largest first, equal logits in index order (a stable descending sort's first k). Probabilities:
// exp(x - max) / sum_j exp(x_j - max), the sum in a fixed order, so a row's result never depends on its batch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "isa.h"
#include "vec.h"

namespace specdec {

// The first index of the largest value among four chains' lanes (chain c, lane l: the value `best[c][l]` first
// seen at `where[c][l]`), then the tail from `j` on; -1 where `bad` (a NaN or +Inf was seen).
inline int64_t first_of_largest(const float* best, const int32_t* where, int64_t lanes, const float* row, int64_t j,
                         int64_t v, bool bad) {
  float top = best[0];
  int64_t at_ = where[0];
  for (int64_t l = 1; l < lanes; ++l)
    if (best[l] > top || (best[l] == top && where[l] < at_)) {
      top = best[l];
      at_ = where[l];
    }
  for (; j < v; ++j) {
    bad = bad || !(row[j] < INFINITY);  // NaN or +Inf
    if (row[j] > top) {
      top = row[j];
      at_ = j;
    }
  }
  return bad ? -1 : at_;
}

// The softmax normalizer's terms exp(x - max) as 2^t, t = x log2(e) - max log2(e) (one multiply-add; t <= 0): a
// degree-5 polynomial on t's fraction, within 3e-7 of 2^f relative, scaled by 2^round(t) through the exponent
// bits; 0 below 2^-125. Half the work of vexp (Cephes, 2 ulp), which made the sum most of a row's 16 us:
// recycled probabilities rank draft nodes, and 3e-7 is far below anything that could reorder them.
constexpr float kLog2e = 1.44269504088896341f;
// 2^f on [-0.5, 0.5], highest degree first (fitted for relative error); the eight- and sixteen-lane loops both
// evaluate it by Horner's rule from here, so they stay the same operations.
constexpr float kPow2Poly[6] = {0.0013276453828439116f, 0.009675538167357445f, 0.05550713464617729f,
                                0.24022120237350464f, 0.6931469440460205f, 1.0000001192092896f};

inline vf pow2_terms(vf x, vf l2e, vf off) {
  const vf lo = splat(-125.0f), magic = splat(12582912.0f);  // magic: adding it rounds to the nearest integer
  vf t = fma(x, l2e, off);
  const vi live = t >= lo;  // NaN: not live
  t = live ? t : lo;
  const vf m = t + magic;
  const vf n = m - magic;
  const vi ni = (vi)m - (vi)magic;
  const vf f = t - n;
  vf q = splat(kPow2Poly[0]);
  for (int i = 1; i < 6; ++i) q = fma(q, f, splat(kPow2Poly[i]));
  const vf y = q * (vf)((ni + 127) << 23);
  return live ? y : splat(0.0f);
}

inline float pow2_term(float x, float off) { return pow2_terms(splat(x), splat(kLog2e), splat(off))[0]; }

// The k largest values of a row offered in index order: largest first, equal values in index order.
struct TopK {
  int64_t k, kept = 0;
  float* best;
  int64_t* at;
  bool full() const { return kept == k; }
  float floor() const { return best[k - 1]; }
  void offer(float value, int64_t j) {  // insert after every kept value >= it
    if (kept == k && !(value > best[k - 1])) return;
    int64_t pos = kept < k ? kept++ : k - 1;
    while (pos > 0 && value > best[pos - 1]) {
      best[pos] = best[pos - 1];
      at[pos] = at[pos - 1];
      --pos;
    }
    best[pos] = value;
    at[pos] = j;
  }
};

}  // namespace specdec

#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__)
#define SPECDEC_WIDE_EXPS 1
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq")
namespace specdec {
namespace wide_exps {

// total + the normalizer's terms (pow2_terms) over the row's first v / 16 * 16 logits, sixteen at a time, each
// half added to the eight-lane total in the order the eight-lane loop adds it (the same bits, lane for lane);
// returns where it stopped.
int64_t pow2_sum16(const float* row, int64_t v, float off, vf& total) {
  const __m512 l2e = _mm512_set1_ps(kLog2e), o = _mm512_set1_ps(off), lo = _mm512_set1_ps(-125.0f);
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  int64_t j = 0;
  for (; j + 16 <= v; j += 16) {
    __m512 t = _mm512_fmadd_ps(_mm512_loadu_ps(row + j), l2e, o);
    const __mmask16 live = _mm512_cmp_ps_mask(t, lo, _CMP_GE_OQ);
    t = _mm512_mask_blend_ps(live, lo, t);
    const __m512 m = _mm512_add_ps(t, magic);
    const __m512 f = _mm512_sub_ps(t, _mm512_sub_ps(m, magic));
    const __m512i ni = _mm512_sub_epi32(_mm512_castps_si512(m), _mm512_castps_si512(magic));
    __m512 q = _mm512_set1_ps(kPow2Poly[0]);
    for (int i = 1; i < 6; ++i) q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(kPow2Poly[i]));
    const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(ni, _mm512_set1_epi32(127)), 23));
    const __m512 e = _mm512_maskz_mul_ps(live, q, scale);
    total = total + (vf)_mm512_castps512_ps256(e);
    total = total + (vf)_mm512_extractf32x8_ps(e, 1);
  }
  return j;
}

// The top-k scan sixteen values a step: a step none of whose values beats the current k-th is skipped with one
// compare; the others are offered in index order, as the eight-lane scan offers them (the same k).
int64_t scan16(const float* row, int64_t v, TopK& top) {
  int64_t j = 0;
  for (; j + 16 <= v; j += 16) {
    const __m512 chunk = _mm512_loadu_ps(row + j);
    if (top.full() && !_mm512_cmp_ps_mask(chunk, _mm512_set1_ps(top.floor()), _CMP_GT_OQ)) continue;
    for (int l = 0; l < 16; ++l) top.offer(row[j + l], j + l);
  }
  return j;
}

// argmax_row8's four chains at sixteen lanes (64 values a step); -1 for a row with NaN or +Inf.
int64_t argmax_row16(const float* row, int64_t v) {
  constexpr int kChains = 4;
  const int32_t first = 0;
  if (v < kChains * 16) return first_of_largest(row, &first, 1, row, 1, v, !(row[0] < INFINITY));
  __m512 best[kChains];
  __m512i where[kChains];
  const __m512i step = _mm512_set1_epi32(kChains * 16);
  __mmask16 bad = 0;
  for (int c = 0; c < kChains; ++c) {
    best[c] = _mm512_loadu_ps(row + c * 16);
    where[c] = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                _mm512_set1_epi32(c * 16));
    bad |= _mm512_fpclass_ps_mask(best[c], 0x89);  // QNaN, SNaN, +Inf
  }
  __m512i index[kChains] = {where[0], where[1], where[2], where[3]};
  int64_t j = kChains * 16;
  for (; j + kChains * 16 <= v; j += kChains * 16) {
    for (int c = 0; c < kChains; ++c) {
      index[c] = _mm512_add_epi32(index[c], step);
      const __m512 chunk = _mm512_loadu_ps(row + j + c * 16);
      const __mmask16 above = _mm512_cmp_ps_mask(chunk, best[c], _CMP_GT_OQ);
      best[c] = _mm512_mask_mov_ps(best[c], above, chunk);
      where[c] = _mm512_mask_mov_epi32(where[c], above, index[c]);
      bad |= _mm512_fpclass_ps_mask(chunk, 0x89);
    }
  }
  alignas(64) float flat[kChains * 16];
  alignas(64) int32_t at[kChains * 16];
  for (int c = 0; c < kChains; ++c) {
    _mm512_store_ps(flat + c * 16, best[c]);
    _mm512_store_si512(at + c * 16, where[c]);
  }
  return first_of_largest(flat, at, kChains * 16, row, j, v, bad != 0);
}

}  // namespace wide_exps
}  // namespace specdec
#pragma GCC pop_options
#endif

namespace specdec {
namespace {

// Whether any lane of `chunk` exceeds `floor`. One compare and a movemask on AVX2: testing the lanes one by one
// made the top-k scan 25 us a row of 49,152 logits, against 4.5 us (the softmax sum's exps then take 22 us), in a
// standalone microbenchmark of the two loops; bench/recycle_ops.py times the whole op.
inline bool any_above(vf chunk, float floor) {
#if defined(__AVX2__)
  return _mm256_movemask_ps(_mm256_cmp_ps((__m256)chunk, _mm256_set1_ps(floor), _CMP_GT_OQ)) != 0;
#else
  const vi above = chunk > splat(floor);
  bool any = false;
  for (int l = 0; l < kLanes; ++l) any |= above[l] != 0;
  return any;
#endif
}

std::vector<at::Tensor> top_k_probs(const at::Tensor& logits, int64_t k) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat, "logits must be [N, V] float32");
  const at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), v = x.size(1);
  TORCH_CHECK(k >= 1 && k <= v, "k must be in 1 .. V");
  at::Tensor probs = at::empty({rows, k}, x.options());
  at::Tensor index = at::empty({rows, k}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  float* pp = probs.data_ptr<float>();
  int64_t* ip = index.data_ptr<int64_t>();
  const bool wide = isa::avx512();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> best(k);
    std::vector<int64_t> at_(k);
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * v;
      TopK top{k, 0, best.data(), at_.data()};
      int64_t j = 0;
#if defined(SPECDEC_WIDE_EXPS)
      if (wide) j = wide_exps::scan16(row, v, top);
#endif
      for (; j + kLanes <= v; j += kLanes) {
        const vf chunk = load(row + j);
        if (top.full() && !any_above(chunk, top.floor())) continue;
        for (int l = 0; l < kLanes; ++l) top.offer(chunk[l], j + l);
      }
      for (; j < v; ++j) top.offer(row[j], j);
      const float off = -best[0] * kLog2e;
      vf total = splat(0.0f);
      j = 0;
#if defined(SPECDEC_WIDE_EXPS)
      if (wide) j = wide_exps::pow2_sum16(row, v, off, total);
#endif
      for (; j + kLanes <= v; j += kLanes) total = total + pow2_terms(load(row + j), splat(kLog2e), splat(off));
      float sum = hsum(total);
      for (; j < v; ++j) sum += pow2_term(row[j], off);
      for (int64_t t = 0; t < k; ++t) {
        pp[r * k + t] = pow2_term(best[t], off) / sum;
        ip[r * k + t] = at_[t];
      }
    }
  });
  return {probs, index};
}

// Eight lanes, four chains of them (32 values a step): per lane the largest value and the first index holding it.
int64_t argmax_row8(const float* row, int64_t v) {
  constexpr int kChains = 4;
  const int32_t first = 0;
  if (v < kChains * kLanes) return first_of_largest(row, &first, 1, row, 1, v, !(row[0] < INFINITY));
  vf best[kChains];
  vi where[kChains], index[kChains];
  const vf inf = splat(INFINITY);
  vi bad = vi{0, 0, 0, 0, 0, 0, 0, 0};
  for (int c = 0; c < kChains; ++c) {
    best[c] = load(row + c * kLanes);
    for (int l = 0; l < kLanes; ++l) index[c][l] = c * kLanes + l;
    where[c] = index[c];
    bad = bad | ~(best[c] < inf);  // all ones where a value is NaN or +Inf
  }
  int64_t j = kChains * kLanes;
  for (; j + kChains * kLanes <= v; j += kChains * kLanes) {
    for (int c = 0; c < kChains; ++c) {
      index[c] = index[c] + kChains * kLanes;
      const vf chunk = load(row + j + c * kLanes);
      const vi above = chunk > best[c];  // strictly: an equal later value keeps the earlier index
      best[c] = above ? chunk : best[c];
      where[c] = above ? index[c] : where[c];
      bad = bad | ~(chunk < inf);
    }
  }
  float flat[kChains * kLanes];
  int32_t at[kChains * kLanes];
  bool any_bad = false;
  for (int c = 0; c < kChains; ++c)
    for (int l = 0; l < kLanes; ++l) {
      flat[c * kLanes + l] = best[c][l];
      at[c * kLanes + l] = where[c][l];
    }
  for (int l = 0; l < kLanes; ++l) any_bad = any_bad || bad[l] != 0;
  return first_of_largest(flat, at, kChains * kLanes, row, j, v, any_bad);
}

at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.size(1) > 0,
              "logits must be [N, V] float32 with V > 0");
  const at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), v = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  const bool wide = isa::avx512();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
#if defined(SPECDEC_WIDE_EXPS)
      if (wide) {
        op[r] = wide_exps::argmax_row16(xp + r * v, v);
        continue;
      }
#endif
      op[r] = argmax_row8(xp + r * v, v);
    }
  });
  return out;
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_cpu, m) {
  m.def("argmax_rows(Tensor logits) -> Tensor");
  m.impl("argmax_rows", c10::DispatchKey::CPU, &specdec::argmax_rows);
  m.def("top_k_probs(Tensor logits, int k) -> Tensor[]");
  m.impl("top_k_probs", c10::DispatchKey::CPU, &specdec::top_k_probs);
}
