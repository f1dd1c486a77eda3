// Paged attention for CPU with a fixed reduction order per query row.
//
// Same arguments and meaning as specdec.kernels.reference.paged_attention. Each (query row, KV head) is one
// task: it lists the keys its row may see, in position order (the committed prefix through the block table,
// then the visible new tokens in node order, which along a tree path is depth order), and runs
// `attend_row` over that list. The list, and so every sum, depends only on that row: a decode token, the same
// token as a tree node, as a row of a prefill chunk, or beside any other sequences in a batch all go through
// the same loop over the same keys in the same order, and give the same bits. Masked keys are not skipped
// over: they are never in the list. No padding, no gather copy: K and V are read straight from the cache.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "ops.h"
#include "vec.h"

namespace specdec {
namespace {

// Dot product of two head vectors in a fixed order (two accumulators, then a fixed horizontal sum).
inline float dot(const float* a, const float* b, int64_t d) {
  vf acc0 = splat(0.0f), acc1 = splat(0.0f);
  int64_t i = 0;
  for (; i + 2 * kLanes <= d; i += 2 * kLanes) {
    acc0 = fma(load(a + i), load(b + i), acc0);
    acc1 = fma(load(a + i + kLanes), load(b + i + kLanes), acc1);
  }
  if (i + kLanes <= d) {
    acc0 = fma(load(a + i), load(b + i), acc0);
    i += kLanes;
  }
  float s = hsum(acc0 + acc1);
  for (; i < d; ++i) s = fma1(a[i], b[i], s);
  return s;
}

struct Scratch {
  std::vector<int64_t> keys;  // element offsets of the visible keys' rows (slot * kv_heads + head) * D
  std::vector<float> probs;   // [group, padded keys]
};

// Scores of one query head against keys[j0 .. j0 + count) (count <= 8), into out[0 .. count): one
// accumulator per key, fed eight dimensions at a time in order, then a fixed horizontal sum.
inline void scores8(const float* q, const float* k_base, const int64_t* keys, int64_t count, int64_t d, float scale,
                    float* out) {
  if (d % kLanes) {  // head sizes that are not a multiple of 8: the plain dot (still one fixed order)
    for (int64_t t = 0; t < count; ++t) out[t] = dot(q, k_base + keys[t], d) * scale;
    return;
  }
  vf acc[kLanes];
  for (int64_t t = 0; t < count; ++t) acc[t] = splat(0.0f);
  for (int64_t i = 0; i < d; i += kLanes) {
    const vf qv = load(q + i);
    for (int64_t t = 0; t < count; ++t) acc[t] = fma(qv, load(k_base + keys[t] + i), acc[t]);
  }
  for (int64_t t = 0; t < count; ++t) out[t] = hsum(acc[t]) * scale;
}

// out[0 .. d) = sum_j p[j] v_j / total over the listed keys, in key order, sixty-four dimensions at a time in
// registers.
inline void weighted_values(const float* p, const float* v_base, const int64_t* keys, int64_t n, int64_t d,
                            float total, float* out) {
  constexpr int64_t kBlock = 8 * kLanes;
  int64_t i0 = 0;
  for (; i0 + kBlock <= d; i0 += kBlock) {
    vf acc[8];
    for (int l = 0; l < 8; ++l) acc[l] = splat(0.0f);
    for (int64_t j = 0; j < n; ++j) {
      const float* v = v_base + keys[j] + i0;
      const vf pj = splat(p[j]);
      for (int l = 0; l < 8; ++l) acc[l] = fma(pj, load(v + l * kLanes), acc[l]);
    }
    const vf t = splat(total);
    for (int l = 0; l < 8; ++l) store(out + i0 + l * kLanes, acc[l] / t);
  }
  for (int64_t i = i0; i < d; ++i) {  // the rest of the head, one dimension at a time (same order per element)
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc = fma1(p[j], v_base[keys[j] + i], acc);
    out[i] = acc / total;
  }
}

// Softmax attention of `group` query heads (rows of `q`, D apart) over the keys at `keys`, written to `out`.
__attribute__((noinline)) void attend_row(const float* q, int64_t group, const float* k_base, const float* v_base,
                                          const int64_t* keys, int64_t n, int64_t d, float scale, float* out,
                                          Scratch& s) {
  const int64_t padded = (n + kLanes - 1) / kLanes * kLanes;
  s.probs.resize(group * padded);
  for (int64_t g = 0; g < group; ++g)
    for (int64_t j0 = 0; j0 < n; j0 += kLanes)
      scores8(q + g * d, k_base, keys + j0, std::min<int64_t>(kLanes, n - j0), d, scale, s.probs.data() + g * padded + j0);
  for (int64_t g = 0; g < group; ++g) {
    float* p = s.probs.data() + g * padded;
    for (int64_t j = n; j < padded; ++j) p[j] = p[0];  // padding: any real score, zeroed after the exp
    vf m = load(p);
    for (int64_t j = kLanes; j < padded; j += kLanes) m = vmax(m, load(p + j));
    const vf mx = splat(hmax(m));
    vf total = splat(0.0f);
    for (int64_t j = 0; j < padded; j += kLanes) {
      vf e = vexp(load(p + j) - mx);
      if (j + kLanes > n) {
        for (int64_t l = n - j; l < kLanes; ++l) e[l] = 0.0f;
      }
      store(p + j, e);
      total = total + e;
    }
    weighted_values(p, v_base, keys, n, d, hsum(total), out + g * d);
  }
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& prefix_lens,
                           const at::Tensor& query_start_loc, const c10::optional<at::Tensor>& tree_mask,
                           double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(), "q must be [T, Hq, D] float32");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == at::kFloat && v_cache.is_contiguous(),
              "caches must be [blocks, block_size, kv_heads, D] float32, contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && prefix_lens.scalar_type() == at::kInt &&
                  query_start_loc.scalar_type() == at::kInt,
              "block tables, prefix lengths and query starts must be int32");
  const int64_t rows = q.size(0), q_heads = q.size(1), d = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == d && q_heads % kv_heads == 0, "head shapes do not match");
  const int64_t group = q_heads / kv_heads;
  const at::Tensor tables = block_tables.contiguous(), prefixes = prefix_lens.contiguous(),
                   starts = query_start_loc.contiguous();
  const int64_t num_seqs = prefixes.size(0), table_width = tables.size(1);
  const int32_t* table = tables.data_ptr<int32_t>();
  const int32_t* prefix = prefixes.data_ptr<int32_t>();
  const int32_t* start = starts.data_ptr<int32_t>();
  TORCH_CHECK(starts.size(0) == num_seqs + 1 && start[num_seqs] == rows, "query_start_loc does not cover q");
  at::Tensor mask;
  const int32_t* mask_words = nullptr;
  int64_t mask_width = 0;
  if (tree_mask.has_value() && tree_mask->defined()) {
    mask = tree_mask->contiguous();
    TORCH_CHECK(mask.scalar_type() == at::kInt && mask.dim() == 2 && mask.size(0) == rows, "tree_mask must be [T, W] int32");
    mask_words = mask.data_ptr<int32_t>();
    mask_width = mask.size(1);
  }
  std::vector<int64_t> seq_of(rows);
  for (int64_t b = 0; b < num_seqs; ++b) {
    TORCH_CHECK(start[b] <= start[b + 1], "query_start_loc must not decrease");
    TORCH_CHECK((prefix[b] + start[b + 1] - start[b] + block_size - 1) / block_size <= table_width,
                "a block table is too short for its sequence");
    for (int64_t t = start[b]; t < start[b + 1]; ++t) seq_of[t] = b;
  }

  at::Tensor out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
    Scratch s;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / kv_heads, h = task % kv_heads, b = seq_of[t];
      const int64_t p = prefix[b], i = t - start[b], n_new = start[b + 1] - start[b];
      const int32_t* blocks = table + b * table_width;
      auto offset = [&](int64_t pos) {
        const int64_t slot = static_cast<int64_t>(blocks[pos / block_size]) * block_size + pos % block_size;
        return (slot * kv_heads + h) * d;
      };
      s.keys.clear();
      for (int64_t pos = 0; pos < p; ++pos) s.keys.push_back(offset(pos));
      for (int64_t j = 0; j < n_new; ++j) {
        const bool visible = mask_words ? ((mask_words[t * mask_width + j / 32] >> (j % 32)) & 1) : (j <= i);
        if (visible) s.keys.push_back(offset(p + j));
      }
      attend_row(qp + (t * q_heads + h * group) * d, group, kp, vp, s.keys.data(),
                 static_cast<int64_t>(s.keys.size()), d, sc, op + (t * q_heads + h * group) * d, s);
    }
  });
  return out;
}

}  // namespace

namespace ops {
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& prefix_lens,
                           const at::Tensor& query_start_loc, const c10::optional<at::Tensor>& tree_mask,
                           double scale) {
  return specdec::paged_attention(q, k_cache, v_cache, block_tables, prefix_lens, query_start_loc, tree_mask, scale);
}
}  // namespace ops
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor prefix_lens, "
        "Tensor query_start_loc, Tensor? tree_mask, float scale) -> Tensor");
  m.impl("paged_attention", c10::DispatchKey::CPU, &specdec::paged_attention);
}
