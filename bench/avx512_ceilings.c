// What one AVX-512 core can do, whatever a kernel's memory traffic: the ceilings a tree's extra verified rows
// run into on a CPU without AMX (issue 12: every row of a tree costs the int8 linears' multiply-adds and
// attention's float ones).
//
//   fma peak          independent 512-bit float multiply-adds (twelve chains): the float ceiling
//   vpdpbusd peak     independent 512-bit int8 dot-product steps (eight chains, 64 products each): the ceiling
//                     of the int8 linears' VNNI kernels (qlinear_vnni.cpp) once extra rows make them compute-bound
//   scores16, before  the same scores one query at a time as the kernel ran them before 957709b (sixteen residue
//                     accumulators, dimensions innermost)
//   scores16, Q = N   attention's keys-in-lanes scores (specdec/kernels/cpu/attention_rows.h) for N queries
//                     sharing each transposed key row: 16 keys x 64 dimensions, the kernel's own loop order
//                     (residue pairs outermost, queries innermost), from L1
//
//     gcc -O3 -mavx512f -mavx512vnni bench/avx512_ceilings.c -o /tmp/avx512_ceilings && /tmp/avx512_ceilings
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static float queries[64 * 64] __attribute__((aligned(64)));
static float keys_t[64 * 16] __attribute__((aligned(64)));
static volatile float sink;

static void fma_peak(void) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(i * 0.001f);
  const __m512 b = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(0.0001f);
  const long n = 100000000;
  const double t0 = now();
  for (long k = 0; k < n; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
  }
  const double t = now() - t0;
  for (int i = 0; i < 12; ++i) sink += a[i][0];
  printf("fma peak          %.2f G 512-bit multiply-adds/s (%.0f GFLOP/s)\n", n * 12 / t / 1e9, n * 12 * 32 / t / 1e9);
}

static void vpdpbusd_peak(void) {
  // Eight named accumulators, each one instruction's own register: an array of them, stepped through inline
  // assembly, lived in memory (a load and a store around every instruction) and halved the rate.
  __m512i a0 = _mm512_set1_epi32(0), a1 = _mm512_set1_epi32(1), a2 = _mm512_set1_epi32(2), a3 = _mm512_set1_epi32(3);
  __m512i a4 = _mm512_set1_epi32(4), a5 = _mm512_set1_epi32(5), a6 = _mm512_set1_epi32(6), a7 = _mm512_set1_epi32(7);
  const __m512i b = _mm512_set1_epi32(0x01010101), c = _mm512_set1_epi32(0x02020202);
  const long n = 100000000;
  const double t0 = now();
  for (long k = 0; k < n; ++k) {
    a0 = _mm512_dpbusd_epi32(a0, b, c);
    a1 = _mm512_dpbusd_epi32(a1, b, c);
    a2 = _mm512_dpbusd_epi32(a2, b, c);
    a3 = _mm512_dpbusd_epi32(a3, b, c);
    a4 = _mm512_dpbusd_epi32(a4, b, c);
    a5 = _mm512_dpbusd_epi32(a5, b, c);
    a6 = _mm512_dpbusd_epi32(a6, b, c);
    a7 = _mm512_dpbusd_epi32(a7, b, c);
  }
  const double t = now() - t0;
  const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                       _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
  sink += (float)_mm512_reduce_add_epi32(sum);
  printf("vpdpbusd peak     %.2f G 512-bit steps/s (%.0f G int8 multiply-adds/s)\n", n * 8 / t / 1e9,
         n * 8 * 64 / t / 1e9);
}

// Q queries against 16 transposed keys of 64 dimensions, as attention_rows.h's scores16<Q> runs them.
#define SCORES16(Q)                                                                                         \
  static __attribute__((noinline)) void scores16_##Q(const float* const* q, const float* kt, __m512* f) {   \
    for (int l = 0; l < 8; ++l) {                                                                           \
      __m512 lo[Q], hi[Q];                                                                                  \
      for (int g = 0; g < Q; ++g) lo[g] = hi[g] = _mm512_setzero_ps();                                      \
      for (int i = 0; i < 64; i += 16) {                                                                    \
        const __m512 k_lo = _mm512_load_ps(kt + (i + l) * 16), k_hi = _mm512_load_ps(kt + (i + l + 8) * 16); \
        for (int g = 0; g < Q; ++g) {                                                                       \
          lo[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g][i + l]), k_lo, lo[g]);                                \
          hi[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g][i + l + 8]), k_hi, hi[g]);                            \
        }                                                                                                   \
      }                                                                                                     \
      for (int g = 0; g < Q; ++g) f[l * Q + g] = _mm512_add_ps(lo[g], hi[g]);                               \
    }                                                                                                       \
  }                                                                                                         \
  static void time_scores16_##Q(void) {                                                                     \
    __m512 f[8 * Q], total = _mm512_setzero_ps();                                                           \
    const long reps = 8000000 / Q;                                                                          \
    const double t0 = now();                                                                                \
    for (long r = 0; r < reps; ++r) {                                                                       \
      const float* q[Q];                                                                                    \
      for (int g = 0; g < Q; ++g) q[g] = queries + ((r * Q + g) & 63) * 64;                                 \
      scores16_##Q(q, keys_t, f);                                                                           \
      total = _mm512_add_ps(total, f[0]);                                                                   \
    }                                                                                                       \
    const double t = now() - t0;                                                                            \
    sink += total[0];                                                                                       \
    printf("scores16, Q = %d   %.2f G 512-bit multiply-adds/s\n", Q, reps * Q * 64 / t / 1e9);                \
  }

static void time_scores16_before(void) {
  __m512 total = _mm512_setzero_ps();
  const long reps = 8000000;
  const double t0 = now();
  for (long r = 0; r < reps; ++r) {
    const float* q = queries + (r & 63) * 64;
    __m512 acc[16];
    for (int l = 0; l < 16; ++l) acc[l] = _mm512_setzero_ps();
    for (int i = 0; i < 64; i += 16) {
#pragma GCC unroll 16
      for (int l = 0; l < 16; ++l)
        acc[l] = _mm512_fmadd_ps(_mm512_set1_ps(q[i + l]), _mm512_load_ps(keys_t + (i + l) * 16), acc[l]);
    }
    for (int l = 0; l < 8; ++l) total = _mm512_add_ps(total, _mm512_add_ps(acc[l], acc[l + 8]));
  }
  const double t = now() - t0;
  sink += total[0];
  printf("scores16, before  %.2f G 512-bit multiply-adds/s\n", reps * 64 / t / 1e9);
}

SCORES16(1)
SCORES16(2)
SCORES16(4)
SCORES16(6)

int main(void) {
  for (int i = 0; i < 64 * 64; ++i) queries[i] = i * 1e-4f;
  for (int i = 0; i < 64 * 16; ++i) keys_t[i] = i * 1e-4f;
  fma_peak();
  vpdpbusd_peak();
  time_scores16_before();
  time_scores16_1();
  time_scores16_2();
  time_scores16_4();
  time_scores16_6();
  return 0;
}
