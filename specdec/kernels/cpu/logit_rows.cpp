// Reductions over rows of logits, each one pass over a row: the argmax that greedy verification reads, and the
// k largest logits with their softmax probabilities that Token Recycling writes into its matrix.
//
// argmax_rows: torch's argmax takes 35 us a row of 49,152 logits on this CPU (0.3 ms for an 8-node tree) and
// needs the rows in one tensor (a copy); this reads each row once, eight lanes at a time. Ties go to the first
// index, as torch's; the engine has checked the logits are finite (health.py) before it verifies.
//
// top_k_probs: the k largest logits of each row with their softmax probabilities: what Token
// Recycling writes into its matrix after every verified step. torch needs a top-k and a full logsumexp (two
// passes, about 1.2 ms a step for an 8-node tree over a 49,152-token vocabulary on this CPU); here a row is
// read once, and a chunk of eight logits none of which beats the current k-th is skipped with one compare; on
// AVX-512 the softmax sum's exps run sixteen at a time (22 -> ~11 us a row).
//
// Order: largest first, equal logits in index order (a stable descending sort's first k). Probabilities:
// exp(x - max) / sum_j exp(x_j - max), the sum in a fixed order, so a row's result never depends on its batch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "isa.h"
#include "vec.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__)
#define SPECDEC_WIDE_EXPS 1
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq")
namespace specdec {
namespace wide_exps {
#include "vec16.h"

// total + sum of exp(x - mx) over the row's first v / 16 * 16 logits, sixteen exps at a time, each half added to
// the eight-lane total in the order the eight-lane loop adds it (the same bits); returns where it stopped.
int64_t exp_sum16(const float* row, int64_t v, float mx, vf& total) {
  const __m512 m = _mm512_set1_ps(mx);
  int64_t j = 0;
  for (; j + 16 <= v; j += 16) {
    const __m512 e = vexp16(_mm512_sub_ps(_mm512_loadu_ps(row + j), m));
    total = total + (vf)_mm512_castps512_ps256(e);
    total = total + (vf)_mm512_extractf32x8_ps(e, 1);
  }
  return j;
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
      int64_t kept = 0;
      auto offer = [&](float value, int64_t j) {  // insert after every kept value >= it (ties: index order)
        if (kept == k && !(value > best[k - 1])) return;
        int64_t pos = kept < k ? kept++ : k - 1;
        while (pos > 0 && value > best[pos - 1]) {
          best[pos] = best[pos - 1];
          at_[pos] = at_[pos - 1];
          --pos;
        }
        best[pos] = value;
        at_[pos] = j;
      };
      int64_t j = 0;
      for (; j + kLanes <= v; j += kLanes) {
        const vf chunk = load(row + j);
        if (kept == k && !any_above(chunk, best[k - 1])) continue;
        for (int l = 0; l < kLanes; ++l) offer(chunk[l], j + l);
      }
      for (; j < v; ++j) offer(row[j], j);
      const float mx = best[0];
      vf total = splat(0.0f);
      j = 0;
#if defined(SPECDEC_WIDE_EXPS)
      if (wide) j = wide_exps::exp_sum16(row, v, mx, total);
#endif
      for (; j + kLanes <= v; j += kLanes) total = total + vexp(load(row + j) - splat(mx));
      float sum = hsum(total);
      for (; j < v; ++j) sum += sexp(row[j] - mx);
      for (int64_t t = 0; t < k; ++t) {
        pp[r * k + t] = sexp(best[t] - mx) / sum;
        ip[r * k + t] = at_[t];
      }
    }
  });
  return {probs, index};
}

at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.size(1) > 0,
              "logits must be [N, V] float32 with V > 0");
  const at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), v = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * v;
      // Per lane the largest value and the first index holding it, then the lanes compared in index order.
      vf best = splat(row[0]);
      vi where = vi{0, 0, 0, 0, 0, 0, 0, 0};
      int64_t j = 0;
      if (v >= kLanes) {
        best = load(row);
        where = vi{0, 1, 2, 3, 4, 5, 6, 7};
        vi index = where;
        for (j = kLanes; j + kLanes <= v; j += kLanes) {
          index = index + 8;
          const vf chunk = load(row + j);
          const vi above = chunk > best;  // strictly: an equal later value keeps the earlier index
          best = above ? chunk : best;
          where = above ? index : where;
        }
      } else {
        j = 1;
      }
      float top = best[0];
      int64_t at_ = where[0];
      for (int l = 1; l < kLanes; ++l)
        if (best[l] > top || (best[l] == top && where[l] < at_)) {
          top = best[l];
          at_ = where[l];
        }
      for (; j < v; ++j)
        if (row[j] > top) {
          top = row[j];
          at_ = j;
        }
      op[r] = at_;
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
