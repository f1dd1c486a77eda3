// The arithmetic of attention.cpp, included by it twice: once for every x86 CPU (namespace `base`, eight-lane
// AVX2 registers) and once compiled for AVX-512VL (namespace `wide`), chosen at run time. Not a header to
// include anywhere else.
//
// Both score blocks of kQueryBlock = 3 query heads (a SmolLM2 GQA group, or three tree nodes) against the same
// keys, so that each key vector loaded serves all three: one head at a time loads it three times, and the
// loads, not the multiplies, set the pace (on a 2-core AVX2 EPYC, blocks of three made a 9-row tree's
// attention 1.42-1.46x faster at 256-512 keys, one decode row's 1.03-1.26x; bench/attention_rows.py).
// AVX-512VL's 32 registers hold a block's sixteen-lane accumulators for eight keys at once; AVX2's 16 take them
// in passes (below). Every (query, key) pair still goes through the same fused multiply-adds in the same order,
// whatever the block, so a row's bits do not depend on which rows share its block
// (tests/kernels/test_cpu_kernels.py) and both builds give the same bits (tests/kernels/test_isa.py holds them
// to it).
//
// Expects, before inclusion: SPECDEC_ATTN_NS (the namespace), SPECDEC_ATTN_WIDE (1: AVX-512 code), kQueryBlock,
// vec.h, dot(), hsum8(), Scratch, kKeyChunk.

namespace specdec {
namespace SPECDEC_ATTN_NS {

// Scores of G query heads against keys[0 .. count) (count <= 8), into out[g][0 .. count): one accumulator per
// (head, key), then a fixed horizontal sum. A short chunk repeats its first key in the unused accumulators
// (their scores are dropped), so every chunk runs the same code.
//
// Head sizes that are a multiple of 16 accumulate sixteen lanes (lane l: dimensions l, l + 16, l + 32, ... in
// order), folded to eight as lanes l + (l + 8), then summed as below: one 512-bit register a key with
// AVX-512, two 256-bit halves with AVX2, the same operations per lane either way. Other multiples of 8
// accumulate eight lanes; the rest take the plain dot.
template <int G>
inline void scores8(const float* const* q, const float* k_base, const int64_t* keys, int64_t count, int64_t d,
                    float scale, float* const* out) {
  if (d % kLanes) {  // head sizes that are not a multiple of 8: the plain dot (still one fixed order)
    for (int g = 0; g < G; ++g)
      for (int64_t t = 0; t < count; ++t) out[g][t] = dot(q[g], k_base + keys[t], d) * scale;
    return;
  }
  const float* k[kLanes];
  for (int t = 0; t < kLanes; ++t) k[t] = k_base + keys[t < count ? t : 0];
  vf acc[G][kLanes];
  if (d % (2 * kLanes) == 0) {
#if SPECDEC_ATTN_WIDE
    __m512 wide[G][kLanes];
#pragma GCC unroll 8
    for (int t = 0; t < kLanes; ++t)
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) wide[g][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 2 * kLanes) {
      __m512 qv[G];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) qv[g] = _mm512_loadu_ps(q[g] + i);
#pragma GCC unroll 8
      for (int t = 0; t < kLanes; ++t) {
        const __m512 kv = _mm512_loadu_ps(k[t] + i);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) wide[g][t] = _mm512_fmadd_ps(qv[g], kv, wide[g][t]);
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < kLanes; ++t)
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g)
        acc[g][t] = (vf)_mm256_add_ps(_mm512_castps512_ps256(wide[g][t]), _mm512_extractf32x8_ps(wide[g][t], 1));
#else
    // AVX2 has sixteen registers: the low and high eight lanes of each (head, key) are two passes, each
    // holding G query vectors, one key vector and G x T accumulators, so a key vector loaded once serves every
    // head of the block (three heads, twelve accumulators). Each accumulator's chain of multiply-adds is the
    // one above, so the split into passes changes no bit.
    constexpr int T = G == 1 ? kLanes : 4;  // keys a pass
    for (int t0 = 0; t0 < kLanes; t0 += T) {
      vf half[2][G][T];
      for (int part = 0; part < 2; ++part) {
        vf a[G][T] = {};
        for (int64_t i = part * kLanes; i < d; i += 2 * kLanes) {
          vf qv[G];
          for (int g = 0; g < G; ++g) qv[g] = load(q[g] + i);
          for (int t = 0; t < T; ++t) {
            const vf kv = load(k[t0 + t] + i);
            for (int g = 0; g < G; ++g) a[g][t] = fma(qv[g], kv, a[g][t]);
          }
        }
        for (int g = 0; g < G; ++g)
          for (int t = 0; t < T; ++t) half[part][g][t] = a[g][t];
      }
      for (int g = 0; g < G; ++g)
        for (int t = 0; t < T; ++t) acc[g][t0 + t] = half[0][g][t] + half[1][g][t];
    }
#endif
  } else {
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < kLanes; ++t) acc[g][t] = splat(0.0f);
    for (int64_t i = 0; i < d; i += kLanes) {
      vf qv[G];
      for (int g = 0; g < G; ++g) qv[g] = load(q[g] + i);
      for (int t = 0; t < kLanes; ++t) {
        const vf kv = load(k[t] + i);
        for (int g = 0; g < G; ++g) acc[g][t] = fma(qv[g], kv, acc[g][t]);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    const vf scores = hsum8(acc[g]) * splat(scale);
    if (count == kLanes) {
      store(out[g], scores);
    } else {
      for (int64_t t = 0; t < count; ++t) out[g][t] = scores[t];
    }
  }
}

#if SPECDEC_ATTN_WIDE
#include "vec16.h"

// Keys in lanes: Q queries' scores against the same sixteen keys, from kt [d, 16] (the keys transposed), with
// scores8's arithmetic per key, so the same bits: for every key at once, the chain of residue l (dimensions l,
// l + 16, l + 32, ... in order) is what lane l of scores8's accumulator holds for one key; residues l and l + 8
// fold, then the eight fold in hsum's order. Where a tree's many queries share the keys, this spends no
// shuffle per score (scores8 folds and sums each query-key pair across lanes), and transposing the keys once
// serves them all.
//
// Residue pairs (l, l + 8) outermost, queries innermost: each row of kt loaded serves Q queries. One query at
// a time, every multiply-add waited on two loads (a key row and a broadcast query element) and ran at 60% of the
// core's multiply-add rate; four at a time reach it (on a Zen 4 core, 3.66 G 512-bit multiply-adds a second
// against 2.1-2.2 G: bench/avx512_ceilings.c).
template <int Q>
inline void scores16(const float* const* q, const float* kt, int64_t d, float scale, float* const* out) {
  __m512 f[8][Q];
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l) {
    __m512 lo[Q], hi[Q];
#pragma GCC unroll 4
    for (int g = 0; g < Q; ++g) lo[g] = hi[g] = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
      const __m512 k_lo = _mm512_loadu_ps(kt + (i + l) * 16), k_hi = _mm512_loadu_ps(kt + (i + l + 8) * 16);
#pragma GCC unroll 4
      for (int g = 0; g < Q; ++g) {
        lo[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g][i + l]), k_lo, lo[g]);
        hi[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g][i + l + 8]), k_hi, hi[g]);
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < Q; ++g) f[l][g] = _mm512_add_ps(lo[g], hi[g]);
  }
#pragma GCC unroll 4
  for (int g = 0; g < Q; ++g) {
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(f[0][g], f[4][g]), _mm512_add_ps(f[2][g], f[6][g])),
                                     _mm512_add_ps(_mm512_add_ps(f[1][g], f[5][g]), _mm512_add_ps(f[3][g], f[7][g])));
    _mm512_storeu_ps(out[g], _mm512_mul_ps(sum, _mm512_set1_ps(scale)));
  }
}

// kt [d, 16] := the sixteen keys at k_base + keys[0 .. 16), transposed (d a multiple of 16): sixteen
// dimensions at a time, a 16 x 16 block in registers (vec16.h).
inline void transpose16(const float* k_base, const int64_t* keys, int64_t d, float* kt) {
  for (int64_t i = 0; i < d; i += 16) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_ps(k_base + keys[k] + i);
    transpose16x16(r);
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) _mm512_storeu_ps(kt + (i + k) * 16, r[k]);
  }
}

// Queries at least this many share a 16-key block for scores16 to pay for the transpose; scores16 takes them
// kKeysInLanesBlock at a time.
constexpr int64_t kKeysInLanesMinQueries = 6;
constexpr int kKeysInLanesBlock = 4;
#endif

// acc[g][0 .. d) += sum_j p[g][j] v_j over the listed keys, in key order, for G query heads: sixty-four
// dimensions at a time in registers, loaded from and stored back to `acc`, so that splitting the keys into
// runs gives the same bits. Each element is its own chain of fused multiply-adds, so the register width
// (sixteen lanes with AVX-512, eight with AVX2) changes nothing but the speed.
template <int G>
inline void accumulate_values(const float* const* p, const float* v_base, const int64_t* keys, int64_t n, int64_t d,
                              float* const* acc) {
  int64_t i0 = 0;
#if SPECDEC_ATTN_WIDE
  constexpr int64_t kBlock = 8 * kLanes;
  for (; i0 + kBlock <= d; i0 += kBlock) {
    __m512 a[G][4];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) a[g][l] = _mm512_loadu_ps(acc[g] + i0 + 16 * l);
    for (int64_t j = 0; j < n; ++j) {
      const float* v = v_base + keys[j] + i0;
      __m512 pj[G];
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) pj[g] = _mm512_set1_ps(p[g][j]);
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) {
        const __m512 vl = _mm512_loadu_ps(v + 16 * l);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) a[g][l] = _mm512_fmadd_ps(pj[g], vl, a[g][l]);
      }
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g)
#pragma GCC unroll 4
      for (int l = 0; l < 4; ++l) _mm512_storeu_ps(acc[g] + i0 + 16 * l, a[g][l]);
  }
#else
  // Sixteen registers: G heads x `width` vectors of accumulators, G weights and one value vector.
  constexpr int width = G == 1 ? 8 : 4;
  for (; i0 + width * kLanes <= d; i0 += width * kLanes) {
    vf a[G][width];
    for (int g = 0; g < G; ++g)
      for (int l = 0; l < width; ++l) a[g][l] = load(acc[g] + i0 + l * kLanes);
    for (int64_t j = 0; j < n; ++j) {
      const float* v = v_base + keys[j] + i0;
      vf pj[G];
      for (int g = 0; g < G; ++g) pj[g] = splat(p[g][j]);
      for (int l = 0; l < width; ++l) {
        const vf vl = load(v + l * kLanes);
        for (int g = 0; g < G; ++g) a[g][l] = fma(pj[g], vl, a[g][l]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int l = 0; l < width; ++l) store(acc[g] + i0 + l * kLanes, a[g][l]);
  }
#endif
  for (int g = 0; g < G; ++g)
    for (int64_t i = i0; i < d; ++i) {  // the rest of the head, one dimension at a time (same order per element)
      float a = acc[g][i];
      for (int64_t j = 0; j < n; ++j) a = fma1(p[g][j], v_base[keys[j] + i], a);
      acc[g][i] = a;
    }
}

// Queries qi .. qi + count of a block (count <= Max, up to 4) through `fn<G>` with G = count.
template <int Max = kQueryBlock, typename Fn>
inline void by_block(int64_t count, Fn fn) {
  if (Max >= 4 && count == 4) return fn(std::integral_constant<int, 4>{});
  if (Max >= 3 && count == 3) return fn(std::integral_constant<int, 3>{});
  if (Max >= 2 && count == 2) return fn(std::integral_constant<int, 2>{});
  fn(std::integral_constant<int, 1>{});
}

// In place over p[0 .. n) (p padded to a multiple of 8): exp(p - max), zero past n; returns the sum.
inline float softmax_numerators(float* p, int64_t n) {
  const int64_t padded = (n + kLanes - 1) / kLanes * kLanes;
  for (int64_t j = n; j < padded; ++j) p[j] = p[0];  // padding: any real score, zeroed after the exp
  vf m = load(p);
  for (int64_t j = kLanes; j < padded; j += kLanes) m = vmax(m, load(p + j));
  const vf mx = splat(hmax(m));
  vf total = splat(0.0f);
  int64_t j0 = 0;
#if SPECDEC_ATTN_WIDE
  // Sixteen at a time while whole: each half joins the eight-lane total in the order the loop below adds it.
  const __m512 mx16 = _mm512_set1_ps(mx[0]);
  for (; j0 + 2 * kLanes <= n; j0 += 2 * kLanes) {
    const __m512 e = vexp16(_mm512_sub_ps(_mm512_loadu_ps(p + j0), mx16));
    _mm512_storeu_ps(p + j0, e);
    total = total + (vf)_mm512_castps512_ps256(e);
    total = total + (vf)_mm512_extractf32x8_ps(e, 1);
  }
#endif
  for (int64_t j = j0; j < padded; j += kLanes) {
    vf e = vexp(load(p + j) - mx);
    if (j + kLanes > n) {
      for (int64_t l = n - j; l < kLanes; ++l) e[l] = 0.0f;
    }
    store(p + j, e);
    total = total + e;
  }
  return hsum(total);
}

// Asks for the head vectors (d floats) at base + list[from .. to) to come into L2. Between one layer's attention
// and the next, the linears stream megabytes of weights through the caches, so a layer's K and V come from
// memory, and walked key by key through the block table (pages apart, strided within a page) the hardware's
// prefetchers leave each load waiting: one decode row's attention at 1,024 keys cost 311 us with the caches
// flushed against 54 us warm (one SmolLM2 layer, Zen 4). Asking for the next chunk (16 KiB) while one is in
// use brought that to 166 us; asking two chunks ahead, or for all of K and V at once, gained less (253, 267).
// A prefetch changes no result.
inline void prefetch_rows(const float* base, const int64_t* list, int64_t from, int64_t to, int64_t d) {
  for (int64_t j = from; j < to; ++j) {
    const char* row = reinterpret_cast<const char*>(base + list[j]);
    for (int64_t byte = 0; byte < d * static_cast<int64_t>(sizeof(float)); byte += 64)
      __builtin_prefetch(row + byte, 0, 2);
  }
}

// Attention of query rows r0 .. r1 (indices into q) of one sequence for one KV head: `group` query heads a
// row, the sequence's `p` committed keys at `s.prefix`, and of its `n_new` new tokens' keys those row r sees at
// `s.visible` (element offsets, `s.count[r]` of them from r * n_new on; the caller lists them). The prefix is
// shared by every query, so it is walked in blocks of kQueryBlock consecutive queries (rows and heads alike); a
// row's own new keys are walked by its heads.
inline void attend_rows(const float* qp, float* op, int64_t r0, int64_t r1, int64_t q_heads, int64_t h, int64_t group,
                        const float* k_base, const float* v_base, int64_t n_new, int64_t d, float scale, Scratch& s) {
  const int64_t rows = r1 - r0, p = static_cast<int64_t>(s.prefix.size()), nq = rows * group;
  const int64_t padded = (p + n_new + kLanes - 1) / kLanes * kLanes;
  s.scores.resize(nq * padded);
  s.acc.assign(nq * d, 0.0f);
  auto query = [&](int64_t qi) { return qp + ((r0 + qi / group) * q_heads + h * group + qi % group) * d; };
  const float* qs[kQueryBlock];
  float* outs[kQueryBlock];
  const float* ps[kQueryBlock];
  float* accs[kQueryBlock];
  // Scores: the prefix chunk by chunk for every query, then each row's own visible new keys.
  const int64_t* prefix = s.prefix.data();
  prefetch_rows(k_base, prefix, 0, std::min(p, kKeyChunk), d);
  for (int64_t j0 = 0; j0 < p; j0 += kKeyChunk) {
    const int64_t j1 = std::min(p, j0 + kKeyChunk);
    // the next chunk of keys, or after the last one, the first chunk of values
    if (j1 < p) prefetch_rows(k_base, prefix, j1, std::min(p, j1 + kKeyChunk), d);
    else prefetch_rows(v_base, prefix, 0, std::min(p, kKeyChunk), d);
    int64_t jq = j0;  // keys from here on go through scores8
#if SPECDEC_ATTN_WIDE
    if (nq >= kKeysInLanesMinQueries && d % 16 == 0) {
      s.keys_t.resize(d * 16);
      for (; jq + 16 <= j1; jq += 16) {
        transpose16(k_base, s.prefix.data() + jq, d, s.keys_t.data());
        for (int64_t qi = 0; qi < nq; qi += kKeysInLanesBlock) {
          const int64_t count = std::min<int64_t>(kKeysInLanesBlock, nq - qi);
          const float* block_q[kKeysInLanesBlock];
          float* block_out[kKeysInLanesBlock];
          for (int64_t g = 0; g < count; ++g) {
            block_q[g] = query(qi + g);
            block_out[g] = s.scores.data() + (qi + g) * padded + jq;
          }
          by_block<kKeysInLanesBlock>(count, [&](auto block) {
            scores16<decltype(block)::value>(block_q, s.keys_t.data(), d, scale, block_out);
          });
        }
      }
    }
#endif
    for (int64_t qi = 0; qi < nq && jq < j1; qi += kQueryBlock) {
      const int64_t count = std::min<int64_t>(kQueryBlock, nq - qi);
      for (int64_t g = 0; g < count; ++g) qs[g] = query(qi + g);
      for (int64_t j = jq; j < j1; j += kLanes) {
        for (int64_t g = 0; g < count; ++g) outs[g] = s.scores.data() + (qi + g) * padded + j;
        by_block(count, [&](auto block) {
          scores8<decltype(block)::value>(qs, k_base, s.prefix.data() + j, std::min<int64_t>(kLanes, j1 - j), d,
                                          scale, outs);
        });
      }
    }
  }
  s.totals.resize(nq);
  float* totals = s.totals.data();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t m = s.count[r];
    for (int64_t g0 = 0; g0 < group; g0 += kQueryBlock) {
      const int64_t count = std::min<int64_t>(kQueryBlock, group - g0);
      for (int64_t g = 0; g < count; ++g) qs[g] = query(r * group + g0 + g);
      for (int64_t j = 0; j < m; j += kLanes) {
        for (int64_t g = 0; g < count; ++g) outs[g] = s.scores.data() + (r * group + g0 + g) * padded + p + j;
        by_block(count, [&](auto block) {
          scores8<decltype(block)::value>(qs, k_base, s.visible.data() + r * n_new + j,
                                          std::min<int64_t>(kLanes, m - j), d, scale, outs);
        });
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      const int64_t qi = r * group + g;
      totals[qi] = softmax_numerators(s.scores.data() + qi * padded, p + m);
    }
  }
  // Weighted values in the same walk: the prefix chunk by chunk, then each row's new keys, then the division.
  for (int64_t j0 = 0; j0 < p; j0 += kKeyChunk) {
    const int64_t n = std::min(p, j0 + kKeyChunk) - j0;
    prefetch_rows(v_base, prefix, j0 + n, std::min(p, j0 + n + kKeyChunk), d);  // the next chunk of values
    for (int64_t qi = 0; qi < nq; qi += kQueryBlock) {
      const int64_t count = std::min<int64_t>(kQueryBlock, nq - qi);
      for (int64_t g = 0; g < count; ++g) {
        ps[g] = s.scores.data() + (qi + g) * padded + j0;
        accs[g] = s.acc.data() + (qi + g) * d;
      }
      by_block(count, [&](auto block) {
        accumulate_values<decltype(block)::value>(ps, v_base, s.prefix.data() + j0, n, d, accs);
      });
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g0 = 0; g0 < group; g0 += kQueryBlock) {
      const int64_t count = std::min<int64_t>(kQueryBlock, group - g0);
      for (int64_t g = 0; g < count; ++g) {
        const int64_t qi = r * group + g0 + g;
        ps[g] = s.scores.data() + qi * padded + p;
        accs[g] = s.acc.data() + qi * d;
      }
      by_block(count, [&](auto block) {
        accumulate_values<decltype(block)::value>(ps, v_base, s.visible.data() + r * n_new, s.count[r], d, accs);
      });
    }
    for (int64_t g = 0; g < group; ++g) {
      const int64_t qi = r * group + g;
      const float* acc = s.acc.data() + qi * d;
      float* out = op + ((r0 + r) * q_heads + h * group + g) * d;
      const float total = totals[qi];
      int64_t i = 0;
      for (; i + kLanes <= d; i += kLanes) store(out + i, load(acc + i) / splat(total));
      for (; i < d; ++i) out[i] = acc[i] / total;
    }
  }
}

}  // namespace SPECDEC_ATTN_NS
}  // namespace specdec
