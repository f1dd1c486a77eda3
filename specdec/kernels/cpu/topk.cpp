// The k largest logits of each row with their softmax probabilities, in one pass over the row: what Token
// Recycling writes into its matrix after every verified step. torch needs a top-k and a full logsumexp (two
// passes, about 1.2 ms a step for an 8-node tree over a 49,152-token vocabulary on this CPU); here a row is
// read once, and a chunk of eight logits none of which beats the current k-th is skipped with one compare.
//
// Order: largest first, equal logits in index order (a stable descending sort's first k). Probabilities:
// exp(x - max) / sum_j exp(x_j - max), the sum in a fixed order, so a row's result never depends on its batch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "vec.h"

namespace specdec {
namespace {

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
        if (kept == k) {
          const vi above = chunk > splat(best[k - 1]);
          bool any = false;
          for (int l = 0; l < kLanes; ++l) any |= above[l] != 0;
          if (!any) continue;
        }
        for (int l = 0; l < kLanes; ++l) offer(chunk[l], j + l);
      }
      for (; j < v; ++j) offer(row[j], j);
      const float mx = best[0];
      vf total = splat(0.0f);
      j = 0;
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

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_cpu, m) {
  m.def("top_k_probs(Tensor logits, int k) -> Tensor[]");
  m.impl("top_k_probs", c10::DispatchKey::CPU, &specdec::top_k_probs);
}
