// Attention over a bfloat16 K/V cache on AMX tiles: what makes a verified tree row cost attention next to
// nothing on CPUs that have them (Sapphire Rapids and later).
//
// Why: the float32 kernel (attention_rows.h) spends two multiply-adds per (query, key, dimension), so each
// row of a tree pays its whole attention again: at 256 keys, 7 rows of a SmolLM2-135M layer cost 52.6 us
// against 13.0 for one row (bench/attention_rows.py). One tdpbf16ps multiplies a 16 x 32 tile of keys (or
// weights) by a 32 x 16 tile of queries (or values): 8,192 products for the price of a few vector
// instructions, so up to 16 query heads cost about what one does, and the K/V traffic is halved besides
// (here 32.1 us for those 7 rows).
//
// The arithmetic, per (query, key): q rounded to bfloat16 (K is stored so), scores = the tile dot over the head
// dimension (computed as keys times queries, so that keys load straight from the cache's pages and only the
// few queries are transposed); per query over its own key list (the committed prefix, then its visible new
// keys in node order): the largest score, exp(scale * (score - largest)) in float32 (as a power of two, within
// 3e-6: `exp2_weights`), rounded to bfloat16, and the denominator summed from the rounded values; out = (the
// tile dot of those weights with V over the list, 32 list entries a step) / denominator. The list entry i of
// a query sits at step i / 32 and lane i % 32 however the query is batched, so its row of every tile product
// sees the same operands in the same order, and a tile product's row depends on nothing but its own operands:
// a row's output is the same bits alone, in a batch, as a tree node or as a prefill row, the contract of the
// float32 kernel (tests/kernels/test_cpu_kernels.py holds this one to it). Entries past a list's end have
// weight 0; adding a zero product leaves a sum unchanged (short of float32 denormals, which attention weights
// times values do not produce).
//
// How the list is walked: a row whose visible new keys are the first m in node order (a decode row, a chain's
// nodes, prefill rows) has a list that is a prefix of one shared list, the committed keys then every new key
// in node order, and shares that list's V tiles and tile products with the other such rows of its block. The
// other rows (tree nodes off the first path) share the steps that hold only committed keys, then take their own
// steps over their own lists.
#include "attention_bf16.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__) && defined(__linux__)
#define SPECDEC_AMX_ATTENTION 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(SPECDEC_AMX_ATTENTION)
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")
#include "amx_tiles.h"

namespace specdec {
namespace amx_attention {
namespace {

#include "vec16.h"

constexpr int64_t kT = 16;     // tile rows: queries a block, keys a score tile, dimensions an output tile
constexpr int64_t kStep = 32;  // list entries (or head dimensions) one tile product sums over
constexpr int64_t kHeld = 4;   // output tiles held at once (tmm0 .. tmm3): 64 dimensions a pass

// Tiles (amx_tiles.h): tmm0 .. tmm3 accumulate (scores of four blocks of 16 keys; outputs of four blocks of 16
// dimensions); scores take keys through tmm4 / tmm5 and queries through tmm6, weighted values take the weights
// through tmm4 and values through tmm6 / tmm7.
using amx_tiles::configure;

#include "bf16_lists.h"

// tmm(t) += tmm4 * the right operand at `right` (64-byte rows), for an output tile chosen at run time (tile
// numbers are immediates); even tiles take it through tmm6, odd ones through tmm7, so that loading the next
// operand need not wait for the last product to have read its register.
inline void product(int t, const void* right) {
  switch (t) {
    case 0: _tile_loadd(6, right, 64); _tile_dpbf16ps(0, 4, 6); break;
    case 1: _tile_loadd(7, right, 64); _tile_dpbf16ps(1, 4, 7); break;
    case 2: _tile_loadd(6, right, 64); _tile_dpbf16ps(2, 4, 6); break;
    default: _tile_loadd(7, right, 64); _tile_dpbf16ps(3, 4, 7); break;
  }
}

// tmm(t) += the 16 rows of keys at `keys` (`stride` bytes apart) times tmm6, the keys through tmm4 and tmm5 in
// turn.
inline void key_product(int t, const uint16_t* keys, int64_t stride) {
  switch (t) {
    case 0: _tile_loadd(4, keys, stride); _tile_dpbf16ps(0, 4, 6); break;
    case 1: _tile_loadd(5, keys, stride); _tile_dpbf16ps(1, 5, 6); break;
    case 2: _tile_loadd(4, keys, stride); _tile_dpbf16ps(2, 4, 6); break;
    default: _tile_loadd(5, keys, stride); _tile_dpbf16ps(3, 5, 6); break;
  }
}

inline void zero(int t) {
  switch (t) {
    case 0: _tile_zero(0); break;
    case 1: _tile_zero(1); break;
    case 2: _tile_zero(2); break;
    default: _tile_zero(3); break;
  }
}

inline void store(int t, float* dst, int64_t stride) {
  switch (t) {
    case 0: _tile_stored(0, dst, stride); break;
    case 1: _tile_stored(1, dst, stride); break;
    case 2: _tile_stored(2, dst, stride); break;
    default: _tile_stored(3, dst, stride); break;
  }
}

struct Scratch {
  std::vector<uint16_t> q;      // [queries padded to 16, D] bfloat16
  std::vector<uint32_t> qt;     // per 16 queries and 32 dimensions: the tile [16 dimension pairs, 16 queries]
  std::vector<uint16_t> gathered;  // blocks of 16 keys not in consecutive slots, row by row
  std::vector<float> scores;    // [queries padded, width]
  std::vector<uint16_t> w;      // [queries padded, width] bfloat16 weights
  std::vector<float> total;     // [queries]
  std::vector<uint16_t> vt;     // per step of the shared list: D / 16 tiles [16 key pairs, 16 dimensions x 2]
  std::vector<uint16_t> own;    // one step of one row's own list, as vt
  std::vector<int64_t> keys;    // the shared list's element offsets
  std::vector<int64_t> list;    // one row's own list, from its first own step
  std::vector<char> shared;     // per row: its list is a prefix of the shared one
  std::vector<float> acc;       // [16, D] float32
  alignas(64) uint16_t a[kT * kStep];  // a left operand with some rows zeroed
};

}  // namespace

void attend_rows(const float* q, float* out, int64_t r0, int64_t rows, int64_t q_heads, int64_t h, int64_t group,
                 const uint16_t* k_base, const uint16_t* v_base, const int64_t* prefix, int64_t p,
                 const int64_t* new_keys, int64_t n_new, const int64_t* visible, const int64_t* count, int64_t d,
                 float scale) {
  thread_local Scratch s;
  const int64_t nq = rows * group, blocks = (nq + kT - 1) / kT, nqp = blocks * kT;
  const int64_t n = shared_list(prefix, p, new_keys, n_new, visible, count, rows, s.keys, s.shared);
  const int64_t width = (n + kStep - 1) / kStep * kStep, steps = width / kStep;
  const int64_t ksteps = d / kStep, vtiles = d / kT;
  const bool all_shared = std::all_of(s.shared.begin(), s.shared.end(), [](char x) { return x != 0; });
  auto query = [&](int64_t qi) { return q + ((r0 + qi / group) * q_heads + h * group + qi % group) * d; };
  configure();

  // Queries in bfloat16, padded with zero rows.
  s.q.assign(nqp * d, 0);
  for (int64_t qi = 0; qi < nq; ++qi)
    for (int64_t i = 0; i < d; i += kT) to_bf16(query(qi) + i, s.q.data() + qi * d + i);
  // Queries as the right operand: per block of 16 queries and 32 dimensions, the 16 x 16 matrix of (query,
  // dimension pair) transposed, the pair layout of tdpbf16ps. The keys are the left operand, read in place.
  s.qt.resize(blocks * ksteps * kT * kT);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t ks = 0; ks < ksteps; ++ks) {
      __m512 r[16];
      for (int64_t t = 0; t < kT; ++t)
        r[t] = _mm512_loadu_ps(reinterpret_cast<const float*>(s.q.data() + (b * kT + t) * d + ks * kStep));
      transpose16x16(r);
      float* dst = reinterpret_cast<float*>(s.qt.data() + (b * ksteps + ks) * kT * kT);
      for (int t = 0; t < 16; ++t) _mm512_storeu_ps(dst + t * kT, r[t]);
    }
  // Scores, transposed: keys times queries, 16 x 16 a tile, four blocks of keys in flight (a tile product's
  // latency is several times its issue interval). A block of 16 keys in consecutive slots of one page is
  // loaded from the cache as it lies; others are first gathered row by row. Each tile is turned back in
  // registers into per-query rows of scores.
  const int64_t key_blocks = width / kT;
  s.scores.resize(nqp * width);
  s.gathered.resize(kHeld * kT * d);
  for (int64_t kb0 = 0; kb0 < key_blocks; kb0 += kHeld) {
    const int64_t held = std::min(kHeld, key_blocks - kb0);
    const uint16_t* keys[kHeld];
    int64_t stride[kHeld];
    for (int64_t t = 0; t < held; ++t) {
      const int64_t j0 = (kb0 + t) * kT;
      const int64_t step = j0 + 1 < n ? s.keys[j0 + 1] - s.keys[j0] : 0;
      bool in_place = j0 + kT <= n && step > 0;
      for (int64_t i = 2; i < kT && in_place; ++i) in_place = s.keys[j0 + i] == s.keys[j0] + i * step;
      if (in_place) {
        keys[t] = k_base + s.keys[j0];
        stride[t] = step * 2;
        continue;
      }
      uint16_t* rows_t = s.gathered.data() + t * kT * d;
      for (int64_t i = 0; i < kT; ++i) {
        if (j0 + i < n) std::memcpy(rows_t + i * d, k_base + s.keys[j0 + i], d * 2);
        else std::memset(rows_t + i * d, 0, d * 2);
      }
      keys[t] = rows_t;
      stride[t] = d * 2;
    }
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t t = 0; t < held; ++t) zero(static_cast<int>(t));
      for (int64_t ks = 0; ks < ksteps; ++ks) {
        _tile_loadd(6, s.qt.data() + (b * ksteps + ks) * kT * kT, 64);
        for (int64_t t = 0; t < held; ++t) key_product(static_cast<int>(t), keys[t] + ks * kStep, stride[t]);
      }
      const int64_t real = std::min(kT, nq - b * kT);
      for (int64_t t = 0; t < held; ++t) {
        alignas(64) float tile[kT * kT];
        store(static_cast<int>(t), tile, 64);
        __m512 r[16];
        for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(tile + i * kT);
        transpose16x16(r);
        for (int64_t i = 0; i < real; ++i)
          _mm512_storeu_ps(s.scores.data() + (b * kT + i) * width + (kb0 + t) * kT, r[i]);
      }
    }
  }
  // Per query, its list: the prefix, then its visible new keys moved up behind it; weights and denominator
  // (bf16_lists.h).
  s.w.resize(nqp * width);
  std::fill(s.w.begin() + nq * width, s.w.end(), 0);  // the padding queries' rows
  s.total.resize(nq);
  query_weights(s.scores.data(), s.w.data(), s.total.data(), nq, group, p, count, visible, n_new, s.shared, scale,
                width);
  // Values of the shared list, step by step.
  s.vt.resize(steps * vtiles * kT * kStep);
  for (int64_t st = 0; st < steps; ++st)
    pack_values(v_base, s.keys.data() + st * kStep, std::min<int64_t>(kStep, n - st * kStep), d,
                s.vt.data() + st * vtiles * kT * kStep);
  const int64_t full = p / kStep;  // steps that hold committed keys only: every list has them
  s.acc.resize(kT * d);
  s.own.resize(vtiles * kT * kStep);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t q0 = b * kT, q1 = std::min(nq, q0 + kT);
    const int64_t first_row = q0 / group, last_row = (q1 - 1) / group;
    // The steps past the committed-only ones, for the rows whose lists are shared: the block's weights with the
    // other rows zeroed (their own lists follow).
    int64_t shared_steps = full;
    for (int64_t r = first_row; r <= last_row; ++r)
      if (s.shared[r]) shared_steps = std::max(shared_steps, (p + count[r] + kStep - 1) / kStep);
    for (int64_t t0 = 0; t0 < vtiles; t0 += kHeld) {
      const int64_t held = std::min(kHeld, vtiles - t0);
      for (int64_t t = 0; t < held; ++t) zero(static_cast<int>(t));
      for (int64_t st = 0; st < shared_steps; ++st) {
        if (st < full || all_shared) {
          _tile_loadd(4, s.w.data() + q0 * width + st * kStep, width * 2);
        } else {
          std::memset(s.a, 0, sizeof(s.a));
          for (int64_t qi = q0; qi < q1; ++qi)
            if (s.shared[qi / group]) std::memcpy(s.a + (qi - q0) * kStep, s.w.data() + qi * width + st * kStep, 64);
          _tile_loadd(4, s.a, 64);
        }
        for (int64_t t = 0; t < held; ++t)
          product(static_cast<int>(t), s.vt.data() + (st * vtiles + t0 + t) * kT * kStep);
      }
      // Rows with their own lists: their steps from the first that holds a new key.
      for (int64_t r = first_row; r <= last_row && !all_shared; ++r) {
        if (s.shared[r]) continue;
        // its list from the first step it takes on its own: the prefix's tail, then its visible new keys
        const int64_t len = own_list(prefix, p, full * kStep, new_keys, visible + r * n_new, count[r], s.list);
        for (int64_t st = full; st * kStep < len; ++st) {
          pack_values(v_base, s.list.data() + (st - full) * kStep, std::min<int64_t>(kStep, len - st * kStep), d,
                      s.own.data());
          std::memset(s.a, 0, sizeof(s.a));
          for (int64_t qi = std::max(q0, r * group); qi < std::min(q1, (r + 1) * group); ++qi)
            std::memcpy(s.a + (qi - q0) * kStep, s.w.data() + qi * width + st * kStep, 64);
          _tile_loadd(4, s.a, 64);
          for (int64_t t = 0; t < held; ++t) product(static_cast<int>(t), s.own.data() + (t0 + t) * kT * kStep);
        }
      }
      for (int64_t t = 0; t < held; ++t) store(static_cast<int>(t), s.acc.data() + (t0 + t) * kT, d * 4);
    }
    for (int64_t qi = q0; qi < q1; ++qi)
      unshuffle(s.acc.data() + (qi - q0) * d, d, s.total[qi],
                out + ((r0 + qi / group) * q_heads + h * group + qi % group) * d);
  }
  _tile_release();
}

}  // namespace amx_attention
}  // namespace specdec

#pragma GCC pop_options

#else  // no AMX build: never active, never called

namespace specdec {
namespace amx_attention {
void attend_rows(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*,
                 const int64_t*, int64_t, const int64_t*, int64_t, const int64_t*, const int64_t*, int64_t, float) {}
}  // namespace amx_attention
}  // namespace specdec

#endif
