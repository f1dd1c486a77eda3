// Attention over a bfloat16 K/V cache with AVX512-BF16 dot products (vdpbf16ps): the bfloat16 cache's kernel on
// AVX-512 CPUs without AMX (AMD Zen 4 and later, Intel Cooper Lake).
//
// Why: there every verified tree row pays its attention again in float32 (attention_rows.h: two multiply-adds
// per query, key and dimension; at 256 keys a SmolLM2-135M layer took 16.7 us for one row and 60.5 for five on
// a Zen 4 EPYC, bench/attention_rows.py). One vdpbf16ps multiplies and adds pairs of bfloat16 values in sixteen
// lanes, both products of a pair in one instruction: half the instructions of the float32 kernel per
// (query, key), and half the K/V bytes to bring in from memory.
//
// The arithmetic is attention_amx.cpp's, written for sixteen-lane dot products instead of tiles, so the two
// share their definitions (bf16_lists.h) but not their bits: the query rounded to bfloat16; a score is four
// chains, chain c over dimension pairs c, c + 4, c + 8, ... (one vdpbf16ps each, from zero), summed as
// (c0 + c1) + (c2 + c3); the weights and denominator as bf16_lists.h's
// `list_weights`; the output, per dimension, the chain over the list's entries in pairs (2i, 2i + 1), in list
// order, then divided by the denominator. Every chain takes only its own query's operands, in an order set by
// the list alone, so a row gives the same bits alone, batched, as a tree node or as a prefill row
// (tests/kernels/test_cpu_kernels.py holds the kernel to it).
#include "attention_bf16.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__) && defined(__linux__)
#define SPECDEC_BF16_DOT_ATTENTION 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(SPECDEC_BF16_DOT_ATTENTION)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")

namespace specdec {
namespace bf16_attention {
namespace {

#include "vec16.h"

constexpr int64_t kT = 16;     // keys a score block; dimensions a value tile
constexpr int64_t kStep = 32;  // list entries a value step (16 pairs)

#include "bf16_lists.h"

constexpr int kQueries = 6;  // queries a value pass holds: 6 x 4 accumulators of the 32 registers

struct Scratch {
  std::vector<uint16_t> q;       // [queries, D] bfloat16
  std::vector<uint32_t> kt;      // sixteen keys transposed: [D / 2 dimension pairs, 16 keys] bfloat16 pairs
  std::vector<float> scores;     // [queries, width]
  std::vector<uint16_t> w;       // [queries, width] bfloat16 weights
  std::vector<float> total;      // [queries]
  std::vector<uint16_t> vt;      // one step of values: D / 16 tiles [16 entry pairs, 16 dimensions x 2]
  std::vector<float> acc;        // [queries, D] in pack_values' column order
  std::vector<int64_t> keys;     // the shared list's element offsets
  std::vector<int64_t> list;     // one row's own list, from its first own step
  std::vector<int64_t> steps;    // per query: the shared steps it takes
  std::vector<char> shared;      // per row: its list is a prefix of the shared one
};

// kt := the keys at k_base + keys[0 .. 16) as [d / 2, 16] pairs (dimension pair i of key j at i * 16 + j):
// thirty-two dimensions of the sixteen keys at a time, a 16 x 16 transpose of 32-bit pairs in registers.
inline void transpose_keys(const uint16_t* k_base, const int64_t* keys, int64_t d, uint32_t* kt) {
  for (int64_t c = 0; c < d; c += kStep) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(reinterpret_cast<const float*>(k_base + keys[j] + c));
    transpose16x16(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) _mm512_storeu_ps(reinterpret_cast<float*>(kt + (c / 2 + i) * 16), r[i]);
  }
}

// Raw scores of G queries (qp[g]: their dimension pairs) against sixteen keys (kt from transpose_keys), keys in
// lanes: every transposed row of key pairs is loaded once for all G queries, each query keeping four chains (so
// that the multiply-adds of one query do not wait on each other). One query at a time, with sixteen chains and
// a fold at the end, each vdpbf16ps waited on its own two loads: five verified rows at 256 keys cost 2.8 times
// one row, near the float32 kernel's price, though each instruction does twice its work.
template <int G>
inline void scores16(const uint32_t* const* qp, const uint32_t* kt, int64_t pairs, float* const* out) {
  __m512 acc[G][4];
#pragma GCC unroll 6
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < pairs; i += 4) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512bh keys = (__m512bh)_mm512_loadu_si512(kt + (i + c) * 16);
#pragma GCC unroll 6
      for (int g = 0; g < G; ++g)
        acc[g][c] = _mm512_dpbf16_ps(acc[g][c], keys, (__m512bh)_mm512_set1_epi32(static_cast<int>(qp[g][i + c])));
    }
  }
#pragma GCC unroll 6
  for (int g = 0; g < G; ++g)
    _mm512_storeu_ps(out[g], _mm512_add_ps(_mm512_add_ps(acc[g][0], acc[g][1]), _mm512_add_ps(acc[g][2], acc[g][3])));
}

constexpr int kScoreQueries = 6;  // queries a score pass holds: 6 x 4 chains of the 32 registers

// `fn` with std::integral_constant<int, count> (1 <= count <= 6): the one dispatch from a block's query count to
// the templates that take it (scores16, accumulate_step), as attention_rows.h's by_block for the float kernel.
template <typename Fn>
inline void by_count(int64_t count, Fn fn) {
  switch (count) {
    case 6: return fn(std::integral_constant<int, 6>{});
    case 5: return fn(std::integral_constant<int, 5>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    default: return fn(std::integral_constant<int, 1>{});
  }
}
static_assert(kQueries <= 6 && kScoreQueries <= 6, "by_count dispatches blocks of up to six queries");

// acc[g] += the step's values (vt, pack_values' layout) weighted by w[g]'s 32 entries, for G queries: four tiles
// (64 dimensions) of accumulators in registers at a time, each lane one chain over the sixteen pairs in order.
template <int G>
inline void accumulate_step(const uint16_t* vt, const uint16_t* const* w, float* const* acc, int64_t d) {
  const int64_t tiles = d / kT;
  for (int64_t t0 = 0; t0 < tiles; t0 += 4) {
    const int held = static_cast<int>(std::min<int64_t>(4, tiles - t0));
    __m512 a[G][4];
#pragma GCC unroll 6
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) a[g][t] = t < held ? _mm512_loadu_ps(acc[g] + (t0 + t) * kT) : _mm512_setzero_ps();
    for (int64_t i = 0; i < kStep / 2; ++i) {
      __m512bh v[4];
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t)
        v[t] = (__m512bh)_mm512_loadu_si512(vt + ((t0 + (t < held ? t : 0)) * kT + i) * kStep);
#pragma GCC unroll 6
      for (int g = 0; g < G; ++g) {
        uint32_t pair;
        std::memcpy(&pair, w[g] + 2 * i, sizeof(pair));
        const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) a[g][t] = _mm512_dpbf16_ps(a[g][t], v[t], b);
      }
    }
#pragma GCC unroll 6
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t)
        if (t < held) _mm512_storeu_ps(acc[g] + (t0 + t) * kT, a[g][t]);
  }
}

// Step `st` of the values for the listed queries (`ids`), in passes of kQueries.
inline void accumulate_queries(const std::vector<int64_t>& ids, int64_t st, Scratch& s, int64_t width, int64_t d) {
  const uint16_t* w[kQueries];
  float* acc[kQueries];
  for (size_t k0 = 0; k0 < ids.size(); k0 += kQueries) {
    const int64_t count = std::min<int64_t>(kQueries, static_cast<int64_t>(ids.size() - k0));
    for (int64_t g = 0; g < count; ++g) {
      w[g] = s.w.data() + ids[k0 + g] * width + st * kStep;
      acc[g] = s.acc.data() + ids[k0 + g] * d;
    }
    by_count(count, [&](auto g) { accumulate_step<decltype(g)::value>(s.vt.data(), w, acc, d); });
  }
}

// Asks for the head vectors (d bfloat16) at base + list[from .. to) to come into L2: a layer's K and V arrive
// from memory (the linears in between push them out), walked through the block table, where the hardware's
// prefetchers leave each load waiting (attention_rows.h's prefetch_rows, for the float32 cache).
inline void prefetch(const uint16_t* base, const int64_t* list, int64_t from, int64_t to, int64_t d) {
  for (int64_t j = from; j < to; ++j) {
    const char* row = reinterpret_cast<const char*>(base + list[j]);
    for (int64_t byte = 0; byte < d * 2; byte += 64) __builtin_prefetch(row + byte, 0, 2);
  }
}

constexpr int64_t kAhead = 64;  // list entries a prefetch runs ahead

}  // namespace

void attend_rows(const float* q, float* out, int64_t r0, int64_t rows, int64_t q_heads, int64_t h, int64_t group,
                 const uint16_t* k_base, const uint16_t* v_base, const int64_t* prefix, int64_t p,
                 const int64_t* new_keys, int64_t n_new, const int64_t* visible, const int64_t* count, int64_t d,
                 float scale) {
  thread_local Scratch s;
  const int64_t nq = rows * group, pairs = d / 2;
  const int64_t n = shared_list(prefix, p, new_keys, n_new, visible, count, rows, s.keys, s.shared);
  const int64_t width = (n + kStep - 1) / kStep * kStep;
  auto query = [&](int64_t qi) { return q + ((r0 + qi / group) * q_heads + h * group + qi % group) * d; };

  s.q.resize(nq * d);
  for (int64_t qi = 0; qi < nq; ++qi)
    for (int64_t i = 0; i < d; i += kT) to_bf16(query(qi) + i, s.q.data() + qi * d + i);
  // Scores of every query against the shared list, sixteen keys at a time (a short block repeats its first key;
  // those scores are never read).
  s.scores.resize(nq * width);
  s.kt.resize(pairs * kT);
  int64_t block[kT];
  prefetch(k_base, s.keys.data(), 0, std::min(n, kAhead), d);
  for (int64_t j0 = 0; j0 < n; j0 += kT) {
    // the keys a chunk ahead, or past the last ones, the first values
    if (j0 + kAhead < n) prefetch(k_base, s.keys.data(), j0 + kAhead, std::min(n, j0 + kAhead + kT), d);
    else if (j0 + kAhead - kT < n) prefetch(v_base, s.keys.data(), 0, std::min(n, kAhead), d);
    for (int64_t j = 0; j < kT; ++j) block[j] = s.keys[j0 + j < n ? j0 + j : j0];
    transpose_keys(k_base, block, d, s.kt.data());
    for (int64_t q0 = 0; q0 < nq; q0 += kScoreQueries) {
      const int64_t count = std::min<int64_t>(kScoreQueries, nq - q0);
      const uint32_t* qp[kScoreQueries];
      float* out_rows[kScoreQueries];
      for (int64_t g = 0; g < count; ++g) {
        qp[g] = reinterpret_cast<const uint32_t*>(s.q.data() + (q0 + g) * d);
        out_rows[g] = s.scores.data() + (q0 + g) * width + j0;
      }
      by_count(count, [&](auto g) { scores16<decltype(g)::value>(qp, s.kt.data(), pairs, out_rows); });
    }
  }
  // Each query's list (its visible new keys moved up behind the prefix), weights and denominator.
  s.w.resize(nq * width);
  s.total.resize(nq);
  query_weights(s.scores.data(), s.w.data(), s.total.data(), nq, group, p, count, visible, n_new, s.shared, scale,
                width);
  // Values: the shared list's steps for every query whose list holds them (a row with its own list, up to the
  // last step of committed keys only), then each such row's own steps.
  const int64_t full = p / kStep;
  s.steps.resize(nq);
  int64_t most = 0;
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t r = qi / group;
    s.steps[qi] = s.shared[r] ? (p + count[r] + kStep - 1) / kStep : full;
    most = std::max(most, s.steps[qi]);
  }
  s.acc.assign(nq * d, 0.0f);
  s.vt.resize(d / kT * kT * kStep);
  std::vector<int64_t> ids;
  ids.reserve(nq);
  for (int64_t st = 0; st < most; ++st) {
    const int64_t next = (st + 2) * kStep;  // the step after next: kAhead entries on
    if (next < n) prefetch(v_base, s.keys.data(), next, std::min(n, next + kStep), d);
    pack_values(v_base, s.keys.data() + st * kStep, std::min<int64_t>(kStep, n - st * kStep), d, s.vt.data());
    ids.clear();
    for (int64_t qi = 0; qi < nq; ++qi)
      if (s.steps[qi] > st) ids.push_back(qi);
    accumulate_queries(ids, st, s, width, d);
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (s.shared[r]) continue;
    const int64_t len = own_list(prefix, p, full * kStep, new_keys, visible + r * n_new, count[r], s.list);
    ids.clear();
    for (int64_t g = 0; g < group; ++g) ids.push_back(r * group + g);
    for (int64_t st = full; st * kStep < len; ++st) {
      pack_values(v_base, s.list.data() + (st - full) * kStep, std::min<int64_t>(kStep, len - st * kStep), d,
                  s.vt.data());
      accumulate_queries(ids, st, s, width, d);
    }
  }
  for (int64_t qi = 0; qi < nq; ++qi)
    unshuffle(s.acc.data() + qi * d, d, s.total[qi], out + ((r0 + qi / group) * q_heads + h * group + qi % group) * d);
}

}  // namespace bf16_attention
}  // namespace specdec

#pragma GCC pop_options

#else  // no AVX-512 build: never active, never called

namespace specdec {
namespace bf16_attention {
void attend_rows(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, const uint16_t*, const uint16_t*,
                 const int64_t*, int64_t, const int64_t*, int64_t, const int64_t*, const int64_t*, int64_t, float) {}
}  // namespace bf16_attention
}  // namespace specdec

#endif
