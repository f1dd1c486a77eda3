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
#include <numeric>
#include <type_traits>
#include <vector>

#include "attention_bf16.h"
#include "isa.h"
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

constexpr int64_t kKeyChunk = 64;  // prefix keys per chunk: K or V of a chunk is 16 KiB at head size 64
constexpr int64_t kRowBlock = 16;  // query rows of one sequence per task

struct Scratch {
  std::vector<int64_t> prefix;    // element offsets ((slot * kv_heads + head) * D) of the committed keys
  std::vector<int64_t> visible;   // [rows, n_new]: each row's visible new keys, then its count in `count`
  std::vector<int64_t> count;
  std::vector<float> scores;      // [rows * group, padded list]
  std::vector<float> acc;         // [rows * group, D]
  std::vector<float> totals;      // [rows * group]: softmax denominators
  std::vector<float> keys_t;      // [D, 16]: sixteen keys transposed (attention_rows.h, scores16)
};

}  // namespace

// The row arithmetic twice (attention_rows.h): blocks of three query heads in AVX2's sixteen registers for any
// x86 CPU, and in AVX-512's thirty-two where the CPU has them.
namespace base {
constexpr int kQueryBlock = 3;
}
namespace wide {
constexpr int kQueryBlock = 3;
}
}  // namespace specdec

#define SPECDEC_ATTN_NS base
#define SPECDEC_ATTN_WIDE 0
#include "attention_rows.h"
#undef SPECDEC_ATTN_WIDE
#undef SPECDEC_ATTN_NS

#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512dq")
#define SPECDEC_ATTN_NS wide
#define SPECDEC_ATTN_WIDE 1
#include "attention_rows.h"
#undef SPECDEC_ATTN_WIDE
#undef SPECDEC_ATTN_NS
#pragma GCC pop_options
#define SPECDEC_WIDE_ATTENTION 1
#endif

namespace specdec {
namespace {

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_tables, const at::Tensor& prefix_lens,
                           const at::Tensor& query_start_loc, const c10::optional<at::Tensor>& tree_mask,
                           double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous(), "q must be [T, Hq, D] float32");
  const bool bf16 = k_cache.scalar_type() == at::kBFloat16;
  TORCH_CHECK(k_cache.dim() == 4 && (bf16 || k_cache.scalar_type() == at::kFloat) && k_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == k_cache.scalar_type() &&
                  v_cache.is_contiguous(),
              "caches must be [blocks, block_size, kv_heads, D] float32 or bfloat16, contiguous");
  TORCH_CHECK(!bf16 || (isa::bf16_attention() && q.size(2) % 32 == 0),
              "a bfloat16 K/V cache needs AMX-BF16 or AVX512-BF16 (specdec.kernels.cpu.bf16_attention()) and a head "
              "size divisible by 32");
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
  const float* kp = bf16 ? nullptr : k_cache.data_ptr<float>();
  const float* vp = bf16 ? nullptr : v_cache.data_ptr<float>();
  const uint16_t* kh = bf16 ? reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>()) : nullptr;
  const uint16_t* vh = bf16 ? reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>()) : nullptr;
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t num_tasks = static_cast<int64_t>(task_seq.size()) * kv_heads;
  const bool wide = isa::avx512(), tiles = isa::bf16_tile_attention();
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
      // Causal rows (prefill chunks, decode rows) all see the new keys before this block's first row: those join
      // the committed prefix, which the kernels walk once for every query of the block (the float kernel with
      // the keys in lanes) instead of once per row. Each list keeps its order (the prefix, then its own new
      // keys), so every row gets the same bits; a 600-token prefill's attention took 212 ms walking them per row.
      const int64_t shift = mask_words ? 0 : r0 - first;
      s.prefix.insert(s.prefix.end(), new_keys.begin(), new_keys.begin() + shift);
      const int64_t* own = new_keys.data() + shift;
      const int64_t n_own = n_new - shift;
      // Each row's visible new keys past the shift, in node order: indices for the tiles' kernel, element
      // offsets for the float kernels; causal rows' are copied, not tested key by key.
      const int64_t rows = r1 - r0;
      s.visible.resize(rows * std::max<int64_t>(n_own, 1));
      s.count.assign(rows, 0);
      for (int64_t r = 0; r < rows; ++r) {
        int64_t* list = s.visible.data() + r * n_own;
        if (!mask_words) {
          if (bf16) std::iota(list, list + r + 1, int64_t{0});
          else std::copy(own, own + r + 1, list);
          s.count[r] = r + 1;
          continue;
        }
        const int32_t* words = mask_words + (r0 + r) * mask_width;  // a tree: the row's bits over the new keys
        for (int64_t j = 0; j < n_new; ++j)
          if ((words[j / 32] >> (j % 32)) & 1) list[s.count[r]++] = bf16 ? j : new_keys[j];
      }
      const int64_t p_all = static_cast<int64_t>(s.prefix.size());
      if (bf16) {
        (tiles ? amx_attention::attend_rows : bf16_attention::attend_rows)(
            qp, op, r0, rows, q_heads, h, group, kh, vh, s.prefix.data(), p_all, own, n_own, s.visible.data(),
            s.count.data(), d, sc);
        continue;
      }
#if defined(SPECDEC_WIDE_ATTENTION)
      if (wide) {
        wide::attend_rows(qp, op, r0, r1, q_heads, h, group, kp, vp, n_own, d, sc, s);
        continue;
      }
#endif
      base::attend_rows(qp, op, r0, r1, q_heads, h, group, kp, vp, n_own, d, sc, s);
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
