// Paged attention for CPU with a fixed reduction order per query row.
//
// Same arguments and meaning as specdec.kernels.reference.paged_attention. Every query row has its own list of
// the keys it may see, in position order (the committed prefix through the block table, then the visible new
// tokens in node order, which along a tree path is depth order), and its scores, softmax and weighted sum run
// over that list in that order. The list, and so every sum, depends only on that row: a decode token, the same
// token as a tree node, as a row of a prefill chunk, or beside any other sequences in a batch all go through the
// same arithmetic over the same keys in the same order, and give the same bits. Masked keys are not skipped
// over: they are never in the list. No padding, no gather copy: K and V are read straight from the cache.
//
// What is shared is only the memory traffic: one task takes a block of query rows of one sequence and one KV
// head, and walks the committed prefix (every row's list starts with it) in chunks of 64 keys, giving each
// chunk to every query of the block while it sits in L1. A tree of 8 nodes, or a prefill chunk, reads its
// sequence's cache once instead of once per row; per row the accumulators are carried in memory between
// chunks, so each element's sequence of fused multiply-adds is exactly the one-row sequence.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "ops.h"
#include "vec.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

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

// Eight horizontal sums at once: lane t of the result is hsum(a[t]) (vec.h), bit for bit, since each lane
// adds the same pairs in the same order: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
inline vf hsum8(const vf* a) {
#if defined(__AVX2__)
  __m256 s[4];
  for (int t = 0; t < 4; ++t) {  // lanes (t, t + 4): l0 + l4, l1 + l5, l2 + l6, l3 + l7
    const __m256 x = (__m256)a[t], y = (__m256)a[t + 4];
    s[t] = _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
  }
  // [p0 + p2, p1 + p3] of two accumulators per 128-bit lane
  const __m256 u = _mm256_add_ps(_mm256_shuffle_ps(s[0], s[1], 0x44), _mm256_shuffle_ps(s[0], s[1], 0xEE));
  const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(s[2], s[3], 0x44), _mm256_shuffle_ps(s[2], s[3], 0xEE));
  return (vf)_mm256_add_ps(_mm256_shuffle_ps(u, w, 0x88), _mm256_shuffle_ps(u, w, 0xDD));
#else
  vf out;
  for (int t = 0; t < kLanes; ++t) out[t] = hsum(a[t]);
  return out;
#endif
}

// Scores of one query head against keys[0 .. count) (count <= 8), into out[0 .. count): one accumulator per
// key, fed eight dimensions at a time in order, then the fixed horizontal sum. A short chunk repeats its first
// key in the unused accumulators (their scores are dropped), so every chunk runs the same register code.
inline void scores8(const float* q, const float* k_base, const int64_t* keys, int64_t count, int64_t d, float scale,
                    float* out) {
  if (d % kLanes) {  // head sizes that are not a multiple of 8: the plain dot (still one fixed order)
    for (int64_t t = 0; t < count; ++t) out[t] = dot(q, k_base + keys[t], d) * scale;
    return;
  }
  const float* k[kLanes];
  for (int t = 0; t < kLanes; ++t) k[t] = k_base + keys[t < count ? t : 0];
  vf acc[kLanes] = {};
  for (int64_t i = 0; i < d; i += kLanes) {
    const vf qv = load(q + i);
    for (int t = 0; t < kLanes; ++t) acc[t] = fma(qv, load(k[t] + i), acc[t]);
  }
  const vf scores = hsum8(acc) * splat(scale);
  if (count == kLanes) {
    store(out, scores);
  } else {
    for (int64_t t = 0; t < count; ++t) out[t] = scores[t];
  }
}

constexpr int64_t kKeyChunk = 64;  // prefix keys per chunk: K or V of a chunk is 16 KiB at head size 64
constexpr int64_t kRowBlock = 16;  // query rows of one sequence per task

// acc[0 .. d) += sum_j p[j] v_j over the listed keys, in key order: sixty-four dimensions at a time in
// registers, loaded from and stored back to `acc`, so that splitting the keys into runs gives the same bits.
inline void accumulate_values(const float* p, const float* v_base, const int64_t* keys, int64_t n, int64_t d,
                              float* acc) {
  constexpr int64_t kBlock = 8 * kLanes;
  int64_t i0 = 0;
  for (; i0 + kBlock <= d; i0 += kBlock) {
    vf a[8];
    for (int l = 0; l < 8; ++l) a[l] = load(acc + i0 + l * kLanes);
    for (int64_t j = 0; j < n; ++j) {
      const float* v = v_base + keys[j] + i0;
      const vf pj = splat(p[j]);
      for (int l = 0; l < 8; ++l) a[l] = fma(pj, load(v + l * kLanes), a[l]);
    }
    for (int l = 0; l < 8; ++l) store(acc + i0 + l * kLanes, a[l]);
  }
  for (int64_t i = i0; i < d; ++i) {  // the rest of the head, one dimension at a time (same order per element)
    float a = acc[i];
    for (int64_t j = 0; j < n; ++j) a = fma1(p[j], v_base[keys[j] + i], a);
    acc[i] = a;
  }
}

// In place over p[0 .. n) (p padded to a multiple of 8): exp(p - max), zero past n; returns the sum.
inline float softmax_numerators(float* p, int64_t n) {
  const int64_t padded = (n + kLanes - 1) / kLanes * kLanes;
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
  return hsum(total);
}

struct Scratch {
  std::vector<int64_t> prefix;    // element offsets ((slot * kv_heads + head) * D) of the committed keys
  std::vector<int64_t> visible;   // [rows, n_new]: each row's visible new keys, then its count in `count`
  std::vector<int64_t> count;
  std::vector<float> scores;      // [rows * group, padded list]
  std::vector<float> acc;         // [rows * group, D]
  std::vector<float> totals;      // [rows * group]: softmax denominators
};

// Attention of query rows r0 .. r1 (indices into q) of one sequence for one KV head: `group` query heads a
// row, the sequence's `p` committed keys at `s.prefix`, and its new tokens' keys at `new_keys`, of which row
// r sees those `visible_of(r)` lists.
template <typename Visible>
void attend_rows(const float* qp, float* op, int64_t r0, int64_t r1, int64_t q_heads, int64_t h, int64_t group,
                 const float* k_base, const float* v_base, const int64_t* new_keys, int64_t n_new, int64_t d,
                 float scale, Scratch& s, Visible visible_of) {
  const int64_t rows = r1 - r0, p = static_cast<int64_t>(s.prefix.size()), nq = rows * group;
  const int64_t padded = (p + n_new + kLanes - 1) / kLanes * kLanes;
  s.visible.resize(rows * std::max<int64_t>(n_new, 1));
  s.count.assign(rows, 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n_new; ++j)
      if (visible_of(r0 + r, j)) s.visible[r * n_new + s.count[r]++] = new_keys[j];
  s.scores.resize(nq * padded);
  s.acc.assign(nq * d, 0.0f);
  auto query = [&](int64_t qi) { return qp + ((r0 + qi / group) * q_heads + h * group + qi % group) * d; };
  // Scores: the prefix chunk by chunk for every query, then each row's own visible new keys.
  for (int64_t j0 = 0; j0 < p; j0 += kKeyChunk) {
    const int64_t j1 = std::min(p, j0 + kKeyChunk);
    for (int64_t qi = 0; qi < nq; ++qi)
      for (int64_t j = j0; j < j1; j += kLanes)
        scores8(query(qi), k_base, s.prefix.data() + j, std::min<int64_t>(kLanes, j1 - j), d, scale,
                s.scores.data() + qi * padded + j);
  }
  s.totals.resize(nq);
  float* totals = s.totals.data();
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t r = qi / group, m = s.count[r];
    float* sc = s.scores.data() + qi * padded;
    for (int64_t j = 0; j < m; j += kLanes)
      scores8(query(qi), k_base, s.visible.data() + r * n_new + j, std::min<int64_t>(kLanes, m - j), d, scale,
              sc + p + j);
    totals[qi] = softmax_numerators(sc, p + m);
  }
  // Weighted values in the same walk: the prefix chunk by chunk, then each row's new keys, then the division.
  for (int64_t j0 = 0; j0 < p; j0 += kKeyChunk) {
    const int64_t n = std::min(p, j0 + kKeyChunk) - j0;
    for (int64_t qi = 0; qi < nq; ++qi)
      accumulate_values(s.scores.data() + qi * padded + j0, v_base, s.prefix.data() + j0, n, d, s.acc.data() + qi * d);
  }
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t r = qi / group;
    float* acc = s.acc.data() + qi * d;
    accumulate_values(s.scores.data() + qi * padded + p, v_base, s.visible.data() + r * n_new, s.count[r], d, acc);
    float* out = op + ((r0 + r) * q_heads + h * group + qi % group) * d;
    const float total = totals[qi];
    int64_t i = 0;
    for (; i + kLanes <= d; i += kLanes) store(out + i, load(acc + i) / splat(total));
    for (; i < d; ++i) out[i] = acc[i] / total;
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
  for (int64_t b = 0; b < num_seqs; ++b) {
    TORCH_CHECK(start[b] <= start[b + 1], "query_start_loc must not decrease");
    TORCH_CHECK((prefix[b] + start[b + 1] - start[b] + block_size - 1) / block_size <= table_width,
                "a block table is too short for its sequence");
  }
  // Tasks: (sequence, row block, KV head).
  std::vector<int64_t> task_seq, task_row;
  for (int64_t b = 0; b < num_seqs; ++b)
    for (int64_t r = start[b]; r < start[b + 1]; r += kRowBlock) {
      task_seq.push_back(b);
      task_row.push_back(r);
    }

  at::Tensor out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t num_tasks = static_cast<int64_t>(task_seq.size()) * kv_heads;
  at::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
    Scratch s;
    std::vector<int64_t> new_keys;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task_seq[task / kv_heads], h = task % kv_heads, r0 = task_row[task / kv_heads];
      const int64_t r1 = std::min<int64_t>(start[b + 1], r0 + kRowBlock);
      const int64_t p = prefix[b], n_new = start[b + 1] - start[b];
      const int32_t* blocks = table + b * table_width;
      auto offset = [&](int64_t pos) {
        const int64_t slot = static_cast<int64_t>(blocks[pos / block_size]) * block_size + pos % block_size;
        return (slot * kv_heads + h) * d;
      };
      s.prefix.resize(p);
      for (int64_t pos0 = 0; pos0 < p; pos0 += block_size) {  // block by block: no division per key
        const int64_t base = offset(pos0), stride = kv_heads * d;
        for (int64_t pos = pos0; pos < std::min(p, pos0 + block_size); ++pos) s.prefix[pos] = base + (pos - pos0) * stride;
      }
      new_keys.resize(n_new);
      for (int64_t j = 0; j < n_new; ++j) new_keys[j] = offset(p + j);
      const int64_t first = start[b];
      auto visible = [&](int64_t t, int64_t j) {
        return mask_words ? static_cast<bool>((mask_words[t * mask_width + j / 32] >> (j % 32)) & 1) : (j <= t - first);
      };
      attend_rows(qp, op, r0, r1, q_heads, h, group, kp, vp, new_keys.data(), n_new, d, sc, s, visible);
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
