// What one AVX2 core can do for int8 x int8 dot products, whatever a kernel's memory traffic: the ceiling behind
// issue 14's tree-verification goal (an 8-node tree verified for <= 1.15x a one-token step).
//
// Weights stay in L2 (256 output channels x 576 inputs, SmolLM2-135M's hidden size), laid out as
// specdec/kernels/cpu/qlinear.cpp lays them out (tiles of 4 channels, 32 inputs per step), and each variant is
// that kernel's inner loop, for R rows at once:
//   exact         vpsignb + vpmaddubsw + vpmaddwd + vpaddd per 32 products: what qlinear.cpp runs (exact)
//   no-sign       without vpsignb (wrong for negative activations): what the sign costs
//   no-widen      vpmaddubsw accumulated in int16 (overflows): what the widening to int32 costs
//   maddubs-only  vpmaddubsw + vpaddw alone (wrong): the loop with nothing but the multiplies
// Only `exact` gives the right sums; the others bound from above what any exact rearrangement could reach.
//
//     gcc -O3 -mavx2 -mfma bench/int8_mac_ceiling.c -o /tmp/int8_mac_ceiling && /tmp/int8_mac_ceiling
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define K 576
#define TILES 64
#define REPS 3000

enum Variant { EXACT, NO_SIGN, NO_WIDEN, MADDUBS_ONLY };
static const char* kNames[] = {"exact", "no-sign", "no-widen", "maddubs-only"};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

static inline __m256i term(enum Variant v, __m256i acc, __m256i qa, __m256i q, __m256i w) {
  const __m256i ones = _mm256_set1_epi16(1);
  switch (v) {
    case EXACT: return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(w, q)), ones));
    case NO_SIGN: return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(qa, w), ones));
    case NO_WIDEN: return _mm256_add_epi16(acc, _mm256_maddubs_epi16(qa, _mm256_sign_epi8(w, q)));
    default: return _mm256_add_epi16(acc, _mm256_maddubs_epi16(qa, w));
  }
}

// R rows x one tile of 4 channels; `v` is a compile-time constant in each instantiation below.
#define DEFINE_TILE(R)                                                                            \
  static __attribute__((always_inline)) inline int64_t tile##R(enum Variant v, const int8_t* q, \
                                                               const int8_t* wt) {              \
    __m256i acc[R][4];                                                                           \
    for (int r = 0; r < R; ++r)                                                                  \
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_si256();                           \
    for (int j = 0; j < K / 32; ++j) {                                                           \
      __m256i qv[R], qa[R];                                                                      \
      for (int r = 0; r < R; ++r) {                                                              \
        qv[r] = _mm256_loadu_si256((const __m256i*)(q + r * K + j * 32));                       \
        qa[r] = _mm256_sign_epi8(qv[r], qv[r]);                                                  \
      }                                                                                          \
      for (int c = 0; c < 4; ++c) {                                                              \
        const __m256i w = _mm256_loadu_si256((const __m256i*)(wt + j * 128 + c * 32));          \
        for (int r = 0; r < R; ++r) acc[r][c] = term(v, acc[r][c], qa[r], qv[r], w);            \
      }                                                                                          \
    }                                                                                            \
    int64_t total = 0;                                                                           \
    for (int r = 0; r < R; ++r)                                                                  \
      for (int c = 0; c < 4; ++c) total += hsum(acc[r][c]);                                     \
    return total;                                                                                \
  }
DEFINE_TILE(1)
DEFINE_TILE(2)

// GMAC/s of `rows` rows over every tile, rows taken in pairs as qlinear.cpp does.
#define DEFINE_RUN(V)                                                                  \
  static double run_##V(const int8_t* q, const int8_t* w, int rows, int64_t* check) { \
    const double t = now();                                                            \
    for (int it = 0; it < REPS; ++it)                                                  \
      for (int t4 = 0; t4 < TILES; ++t4) {                                             \
        const int8_t* wt = w + t4 * 4 * K;                                             \
        int r = 0;                                                                     \
        for (; r + 2 <= rows; r += 2) *check += tile2(V, q + r * K, wt);               \
        for (; r < rows; ++r) *check += tile1(V, q + r * K, wt);                       \
      }                                                                                \
    return (double)REPS * TILES * 4 * K * rows / (now() - t) / 1e9;                    \
  }
DEFINE_RUN(EXACT)
DEFINE_RUN(NO_SIGN)
DEFINE_RUN(NO_WIDEN)
DEFINE_RUN(MADDUBS_ONLY)

int main(void) {
  int8_t* w = aligned_alloc(64, TILES * 4 * K);
  int8_t* q = aligned_alloc(64, 8 * K);
  srand(1);
  for (int i = 0; i < TILES * 4 * K; ++i) w[i] = (int8_t)(rand() % 255 - 127);
  for (int i = 0; i < 8 * K; ++i) q[i] = (int8_t)(rand() % 255 - 127);
  double (*runs[])(const int8_t*, const int8_t*, int, int64_t*) = {run_EXACT, run_NO_SIGN, run_NO_WIDEN,
                                                                   run_MADDUBS_ONLY};
  const int row_counts[] = {1, 2, 4, 8};
  int64_t check = 0;
  printf("GMAC/s on one core, int8 weights in L2 (median of 5)\n%-14s", "variant");
  for (int i = 0; i < 4; ++i) printf("  %d row%s", row_counts[i], row_counts[i] > 1 ? "s" : " ");
  printf("\n");
  for (int v = 0; v < 4; ++v) {
    printf("%-14s", kNames[v]);
    for (int i = 0; i < 4; ++i) {
      double best[5];
      for (int k = 0; k < 5; ++k) best[k] = runs[v](q, w, row_counts[i], &check);
      for (int a = 0; a < 5; ++a)  // sort the five for the median
        for (int b = a + 1; b < 5; ++b)
          if (best[b] < best[a]) { double x = best[a]; best[a] = best[b]; best[b] = x; }
      printf("  %6.1f", best[2]);
    }
    printf("\n");
  }
  fprintf(stderr, "(checksum %lld)\n", (long long)check);
  return 0;
}
