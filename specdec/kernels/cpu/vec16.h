// AVX-512 helpers shared by the kernels' sixteen-lane paths. Include once per translation unit, inside an
// AVX-512 target region (#pragma GCC target("avx512f,avx512vl,avx512dq")) and after vec.h: the code here
// assumes the instructions and is never run where isa::avx512() is false.

// vexp (vec.h) on sixteen lanes: the same operations lane by lane, so the same bits. Written out rather than
// shared as a template with vexp: a template defined in vec.h compiles under vec.h's AVX2 target, which would
// split these registers in two and call each AVX-512 multiply-add out of line.
inline __m512 vexp16(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_set1_ps(88.3f), x);  // vexp's x > hi ? hi : x (min and max pass a NaN x on)
  x = _mm512_max_ps(_mm512_set1_ps(-87.3f), x);
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic);
  const __m512 n = _mm512_sub_ps(t, magic);
  const __m512i ni = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(magic));
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 q = _mm512_set1_ps(1.9875691500e-4f);
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.3981999507e-3f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(8.3334519073e-3f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(4.1665795894e-2f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.6666665459e-1f));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_fmadd_ps(q, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512 out = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), _mm512_slli_epi32(ni, 23)));
  return _mm512_mask_blend_ps(underflow, out, _mm512_setzero_ps());
}

// r[0 .. 16) := its transpose, as a 16 x 16 matrix of 32-bit elements (floats, or pairs of bfloat16): interleave
// pairs of elements, then pairs of pairs, then 128-bit quarters, twice. Moves bits only.
inline void transpose16x16(__m512 (&r)[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m512d a = _mm512_castps_pd(t[4 * k]), b = _mm512_castps_pd(t[4 * k + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * k + 2]), e = _mm512_castps_pd(t[4 * k + 3]);
    r[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, e));
    r[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, e));
  }
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    const int h = k / 4 * 8 + k % 4;
    t[h] = _mm512_shuffle_f32x4(r[h], r[h + 4], 0x88);
    t[h + 4] = _mm512_shuffle_f32x4(r[h], r[h + 4], 0xdd);
  }
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
    r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
  }
}
