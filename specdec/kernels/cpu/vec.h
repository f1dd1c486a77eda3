// Eight-float vectors for the CPU kernels, with every fused multiply-add written out.
//
// The kernels are compiled with -ffp-contract=off, so the compiler never fuses a multiply and an add on its
// own: each FMA below is explicit, and the same source gives the same rounding wherever it is inlined. That,
// plus loops whose order depends only on a row's own sizes, is what makes a row's result independent of the
// batch it is computed in.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace specdec {

constexpr int kLanes = 8;
typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

inline vf splat(float x) { return vf{x, x, x, x, x, x, x, x}; }

// a * b + c, rounded once where the CPU has FMA (then everywhere: one binary, one rounding rule).
inline vf fma(vf a, vf b, vf c) {
#if defined(__FMA__) && defined(__AVX2__)
  return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}

inline float fma1(float a, float b, float c) {
#if defined(__FMA__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// Fixed-order horizontal reductions.
inline float hsum(vf v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }

inline vf vmax(vf a, vf b) { return a > b ? a : b; }

inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// exp(x) to about 2 ulp (Cephes' expf polynomial), 0 below -87.3 and capped at exp(88.3).
inline vf vexp(vf x) {
  const vf hi = splat(88.3f), lo = splat(-87.3f);
  vi underflow = x < lo;
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to the nearest integer
  vf t = fma(x, splat(1.44269504088896341f), magic);
  vf n = t - magic;
  vi ni = (vi)t - (vi)magic;
  vf r = fma(n, splat(-0.693359375f), x);
  r = fma(n, splat(2.12194440e-4f), r);
  vf p = splat(1.9875691500e-4f);
  p = fma(p, r, splat(1.3981999507e-3f));
  p = fma(p, r, splat(8.3334519073e-3f));
  p = fma(p, r, splat(4.1665795894e-2f));
  p = fma(p, r, splat(1.6666665459e-1f));
  p = fma(p, r, splat(5.0000001201e-1f));
  vf y = fma(p, r * r, r + splat(1.0f));
  vi bits = (vi)y + (ni << 23);
  vf out = (vf)bits;
  return underflow ? splat(0.0f) : out;
}

inline float sexp(float x) {
  vf v = vexp(splat(x));
  return v[0];
}

#if defined(__AVX2__)
// Integer helpers of the int8 and int4 linears (qlinear.cpp and its VNNI tiles, qlinear_vnni.cpp).
inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// 32 nibbles of one group of 4-bit weights: byte j holds q[j] (low) and q[j + 16] (high).
inline __m256i unpack_q4(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), mask), _mm_and_si128(v, mask));
}
#endif

}  // namespace specdec
