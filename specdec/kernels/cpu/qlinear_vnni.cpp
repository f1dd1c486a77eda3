// The int8 and int4 linear tiles of qlinear.cpp on AVX-512 VNNI: the same exact integer dot products, one
// instruction (vpdpbusd) per 64 products where AVX2 needs four per 32.
//
// Why it matters: verifying a token tree multiplies every weight tile by one activation row per node. With
// AVX2 the integer arithmetic, not the memory traffic, sets the price of each extra row (on a 2-core EPYC,
// 8 rows of SmolLM2's linears cost 2.8x one row); VNNI cuts that arithmetic about fourfold, so the rows of a
// tree come nearly for free while the weights stream from memory once.
//
// vpdpbusd multiplies unsigned bytes by signed bytes, summing four products into each int32 lane:
//   int8 x int8: the weights go in as w + 128 (w ^ 0x80, unsigned), the activations q as they are, and
//                sum (w + 128) q = sum w q + 128 sum q, so the exact dot is the lane total minus 128 sum q;
//   int4 x int8: the 4-bit weights are unsigned already.
// Lane l of a channel's accumulator holds the same four products (bytes 4l .. 4l + 3 of each group of 32) as
// lane l of the AVX2 kernel's maddubs + madd pair, and the float steps after it are the same instructions, so
// both paths give the same bits (tests/kernels/test_isa.py holds them to it). Two channels share one
// 512-bit register: lanes 0-7 the first, 8-15 the second.
//
// The code below is compiled for AVX-512 (target pragma) but runs only where isa::avx512() says the CPU has
// it; the rest of the kernels stay AVX2, one tested build for every x86 machine.
#include "qlinear_vnni.h"

#include "vec.h"

#include <algorithm>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__)  // the build adds -mavx2 on x86 CPUs with AVX
#define SPECDEC_VNNI 1
#include <immintrin.h>
#endif

#if defined(SPECDEC_VNNI)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")

namespace specdec {
namespace vnni {
namespace {

constexpr int64_t kGroup = 32;
constexpr int kTile = 4;
// Tiles ahead to prefetch. The VNNI loop runs so fast per byte that two tiles (AVX2's distance, 4.6 KB at
// K = 576) left 3-7-row blocks waiting on memory: 4 rows of SmolLM2's linears cost more than 8. Six measured
// best of 0, 2, 4, 6, 8 and 16 (bench/int8_rows.py at 1, 4 and 8 rows, rebuilt for each distance).
constexpr int kAhead = 6;
constexpr int kAheadQ4 = 4;  // int4 tiles ahead (a tile of four channels: 2k bytes)
constexpr int64_t kBlock = 16;  // channels of a block of the AMX layout (q8_blocks)

// acc += the four-product sums of a (unsigned bytes) and b (signed bytes), lane by lane. Inline assembly, not
// _mm512_dpbusd_epi32: GCC 12 ties that intrinsic's accumulator to registers 0-15 and, with sixteen
// accumulators live, copies each one out and back around every instruction (three instructions where one
// does, measured as half the speed); "+v" lets the accumulators stay in any of the 32 registers.
inline void dpbusd(__m512i& acc, __m512i a, __m512i b) { asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b)); }

// acc += the four-product sums of a (unsigned bytes) and the four signed bytes at p in every lane: the
// instruction's own broadcast of a memory operand ({1to16}), no separate broadcast or load instruction.
inline void dpbusd_bcast(__m512i& acc, __m512i a, const int32_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*p));
}

// One row's 32 activations in both halves of a register (both channels of a register see the same inputs).
inline __m512i broadcast32(const int8_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The four channels' exact dots from two accumulators (lanes 0-7 and 8-15 each one channel's partial sums),
// less the w + 128 correction: integer sums, so any order of adding gives the same result.
inline __m128i sum_channels(__m512i a01, __m512i a23, int32_t qsum) {
  // 128-bit quarters: [c0 lo, c1 lo, c2 lo, c3 lo] + [c0 hi, c1 hi, c2 hi, c3 hi]
  const __m512i x = _mm512_add_epi32(_mm512_shuffle_i32x4(a01, a23, 0x88), _mm512_shuffle_i32x4(a01, a23, 0xDD));
  __m512i t = _mm512_add_epi32(x, _mm512_shuffle_epi32(x, static_cast<_MM_PERM_ENUM>(0x4E)));
  t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, static_cast<_MM_PERM_ENUM>(0xB1)));  // each quarter: its total
  const __m512i firsts = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m128i totals = _mm512_castsi512_si128(_mm512_permutexvar_epi32(firsts, t));
  return _mm_sub_epi32(totals, _mm_set1_epi32(128 * qsum));
}

template <int R>
void q8_tile(const int8_t* q, const int32_t* qsum, int64_t k, const int8_t* wt, const float* s, const float* ws,
             const float* b, int64_t c0, int64_t n, float* y) {
  __m512i acc01[R], acc23[R];  // two arrays, loops unrolled: every accumulator gets a register of its own
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc01[r] = acc23[r] = _mm512_setzero_si512();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t steps = k / kGroup;
  for (int64_t j = 0; j < steps; ++j) {
    const int8_t* wj = wt + j * kTile * kGroup;
    _mm_prefetch(reinterpret_cast<const char*>(wj + kAhead * kTile * k), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wj + kAhead * kTile * k + 64), _MM_HINT_T0);
    const __m512i w01 = _mm512_xor_si512(_mm512_loadu_si512(wj), flip);  // channels 0, 1 as w + 128
    const __m512i w23 = _mm512_xor_si512(_mm512_loadu_si512(wj + 2 * kGroup), flip);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i qv = broadcast32(q + r * k + j * kGroup);
      dpbusd(acc01[r], w01, qv);
      dpbusd(acc23[r], w23, qv);
    }
  }
  const bool full = c0 + kTile <= n;  // the last tile may hold padding channels: finished one by one
  const __m128 ws4 = full ? _mm_loadu_ps(ws + c0) : _mm_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    int32_t dots[kTile];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dots), sum_channels(acc01[r], acc23[r], qsum[r]));
    if (full) {  // the scalar steps below, four channels at once (same operations, same rounding)
      __m128 v = _mm_mul_ps(_mm_cvtepi32_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dots))),
                            _mm_mul_ps(_mm_set1_ps(s[r]), ws4));
      if (b) v = _mm_add_ps(v, _mm_loadu_ps(b + c0));
      _mm_storeu_ps(y + r * n, v);
      continue;
    }
    for (int c = 0; c < kTile && c0 + c < n; ++c) {
      const float v = static_cast<float>(dots[c]) * (s[r] * ws[c0 + c]);
      y[r * n + c] = b ? v + b[c0 + c] : v;
    }
  }
}

// int4: two channels' 16 bytes of one group (32 bytes: channel 0's, then channel 1's) as 64 weights in the
// order of the spread activations below: low nibbles (inputs 0-15) of both channels, then high (16-31).
// The 32 bytes go to both halves in the load, the high half is shifted by 4 bits, and a mask keeps each nibble.
inline __m512i unpack_q4_pair(const uint8_t* p) {
  const __m512i both = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  return _mm512_and_si512(_mm512_srlv_epi16(both, shifts), _mm512_set1_epi8(0x0F));
}

// Lane l of a channel's accumulator holds the same four products (and so the same float sums, group after
// group) as lane l of qlinear.cpp's AVX2 tile, only placed elsewhere: channel 0 of a pair in lanes 0-3 (its
// lanes 0-3) and 8-11 (its lanes 4-7), channel 1 in 4-7 and 12-15. The spread activations match that: per
// group, inputs 0-15 twice, then inputs 16-31 twice, so one 512-bit load serves every pair of channels and the
// unpacking is three instructions a pair instead of six.
template <int R>
void q4_tile(const int8_t* qs, int64_t k, const uint8_t* wt, const c10::Half* dt, int64_t c0, int64_t n, float* y) {
  const int64_t groups = k / kGroup;
  __m512 acc01[R], acc23[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc01[r] = acc23[r] = _mm512_setzero_ps();
  const __m512i pick01 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
  const __m512i pick23 = _mm512_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3, 2, 2, 2, 2, 3, 3, 3, 3);
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* wg = wt + g * kTile * 16;
    _mm_prefetch(reinterpret_cast<const char*>(wg + kAheadQ4 * kTile * (k / 2)), _MM_HINT_T0);
    const __m512i w01 = unpack_q4_pair(wg);
    const __m512i w23 = unpack_q4_pair(wg + 32);
    const __m512 d4 = _mm512_castps128_ps512(
        _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(dt + g * kTile))));  // 4 float16
    const __m512 d01 = _mm512_permutexvar_ps(pick01, d4);
    const __m512 d23 = _mm512_permutexvar_ps(pick23, d4);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i a = _mm512_loadu_si512(qs + (r * groups + g) * 64);
      __m512i p01 = _mm512_setzero_si512(), p23 = _mm512_setzero_si512();
      dpbusd(p01, w01, a);
      dpbusd(p23, w23, a);
      acc01[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p01), d01, acc01[r]);
      acc23[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p23), d23, acc23[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    // vec.h's hsum of a channel's lanes v0..v7, ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)), for all four
    // channels at once: t = v_l + v_(l+4) is the sum of the two 256-bit halves, one channel per 128-bit lane.
    const __m256 t01 = _mm256_add_ps(_mm512_castps512_ps256(acc01[r]), _mm512_extractf32x8_ps(acc01[r], 1));
    const __m256 t23 = _mm256_add_ps(_mm512_castps512_ps256(acc23[r]), _mm512_extractf32x8_ps(acc23[r], 1));
    __m512 t = _mm512_insertf32x8(_mm512_castps256_ps512(t01), t23, 1);
    t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));  // (t0 + t2, t1 + t3, ...)
    t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));  // ((t0 + t2) + (t1 + t3), ...)
    alignas(64) float sums[16];
    _mm512_store_ps(sums, t);
    for (int c = 0; c < kTile && c0 + c < n; ++c) y[r * n + c] = sums[4 * c];
  }
}

// Channels in lanes: the AMX kernel's copy of the weights (reference.pack_q8_blocks: per block of 16 channels,
// per 4 inputs, one 64-byte line holding those 4 inputs of each of the 16 channels) gives a register of 16
// channels' 4 weights, so one vpdpbusd takes a row's 4 inputs (broadcast by the instruction from memory) into 16
// channels' accumulators at once, and the totals need no reduction across lanes. The tile layout above needs a
// 256-bit broadcast per 128 products and a reduction of every accumulator at the end of each 4-channel tile.
// One block at a time keeps the weights one sequential stream (two blocks side by side, two streams, cost 1.3x
// at one row). Few rows would wait on the multiply's latency with one accumulator a row, so they keep S sets
// of accumulators for successive lines (integer sums: the order of adding cannot change the result).
template <int R>
void q8_block_tile(const int8_t* q, const int32_t* qsum, int64_t k, const int8_t* wb, const float* s,
                   const float* ws, const float* b, int64_t c0, int64_t n, float* y) {
  constexpr int S = R <= 2 ? 4 : R <= 4 ? 2 : 1;
  __m512i acc[S][R];
#pragma GCC unroll 8
  for (int u = 0; u < S; ++u)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[u][r] = _mm512_setzero_si512();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < k / 4; i += S) {  // k / 4 is a multiple of 16
#pragma GCC unroll 4
    for (int u = 0; u < S; ++u) {
      const __m512i w = _mm512_xor_si512(_mm512_loadu_si512(wb + (i + u) * 64), flip);  // as w + 128
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        dpbusd_bcast(acc[u][r], w, reinterpret_cast<const int32_t*>(q + r * k + 4 * (i + u)));
    }
  }
  const int64_t width = std::min<int64_t>(kBlock, n - c0);
  const __mmask16 mask = static_cast<__mmask16>((1u << width) - 1);
  const __m512 w = _mm512_maskz_loadu_ps(mask, ws + c0);
  const __m512 bias = b ? _mm512_maskz_loadu_ps(mask, b + c0) : _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {  // float(dot) * (s * ws) (+ b): the tile path's steps, 16 channels at once
    __m512i total = acc[0][r];
#pragma GCC unroll 4
    for (int u = 1; u < S; ++u) total = _mm512_add_epi32(total, acc[u][r]);
    const __m512i dot = _mm512_sub_epi32(total, _mm512_set1_epi32(128 * qsum[r]));
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(_mm512_set1_ps(s[r]), w));
    if (b) v = _mm512_add_ps(v, bias);
    _mm512_mask_storeu_ps(y + r * n + c0, mask, v);
  }
}

}  // namespace

// Rows eight at a time (the block's weights then come from cache for the next eight), the rest in one pass.
void q8_blocks(const int8_t* q, const int32_t* qsum, int64_t rows, int64_t k, const int8_t* wp, const float* s,
               const float* ws, const float* b, int64_t cb0, int64_t cb1, int64_t n, float* y) {
  for (int64_t cb = cb0; cb < cb1; ++cb) {
    const int8_t* wb = wp + cb * kBlock * k;
    const int64_t c0 = cb * kBlock;
    for (int64_t r = 0; r < rows;) {
      const int64_t m = std::min<int64_t>(rows - r, 8);
      const int8_t* qr = q + r * k;
      float* yr = y + r * n;
      switch (m) {
        case 8: q8_block_tile<8>(qr, qsum + r, k, wb, s + r, ws, b, c0, n, yr); break;
        case 7: q8_block_tile<7>(qr, qsum + r, k, wb, s + r, ws, b, c0, n, yr); break;
        case 6: q8_block_tile<6>(qr, qsum + r, k, wb, s + r, ws, b, c0, n, yr); break;
        case 5: q8_block_tile<5>(qr, qsum + r, k, wb, s + r, ws, b, c0, n, yr); break;
        case 4: q8_block_tile<4>(qr, qsum + r, k, wb, s + r, ws, b, c0, n, yr); break;
        case 3: q8_block_tile<3>(qr, qsum + r, k, wb, s + r, ws, b, c0, n, yr); break;
        case 2: q8_block_tile<2>(qr, qsum + r, k, wb, s + r, ws, b, c0, n, yr); break;
        default: q8_block_tile<1>(qr, qsum + r, k, wb, s + r, ws, b, c0, n, yr); break;
      }
      r += m;
    }
  }
}

void q4_spread(const int8_t* q, int64_t rows, int64_t k, int8_t* qs) {
  const __m512i order = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
  for (int64_t i = 0; i < rows * (k / kGroup); ++i) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i * kGroup));
    _mm512_storeu_si512(qs + i * 64, _mm512_permutexvar_epi64(order, _mm512_castsi256_si512(v)));
  }
}

// Row blocks of 8, then 4, 2 and 1: up to 16 accumulators, the tile's weights loaded once per block.
void q8_rows(const int8_t* q, const int32_t* qsum, int64_t rows, int64_t k, const int8_t* wt, const float* s,
             const float* ws, const float* b, int64_t c0, int64_t n, float* y) {
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) q8_tile<8>(q + r * k, qsum + r, k, wt, s + r, ws, b, c0, n, y + r * n);
  for (; r + 4 <= rows; r += 4) q8_tile<4>(q + r * k, qsum + r, k, wt, s + r, ws, b, c0, n, y + r * n);
  for (; r + 2 <= rows; r += 2) q8_tile<2>(q + r * k, qsum + r, k, wt, s + r, ws, b, c0, n, y + r * n);
  for (; r < rows; ++r) q8_tile<1>(q + r * k, qsum + r, k, wt, s + r, ws, b, c0, n, y + r * n);
}

void q4_rows(const int8_t* qs, int64_t rows, int64_t k, const uint8_t* wt, const c10::Half* dt, int64_t c0, int64_t n,
             float* y) {
  const int64_t row = 2 * k;  // spread bytes a row
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) q4_tile<8>(qs + r * row, k, wt, dt, c0, n, y + r * n);
  for (; r + 4 <= rows; r += 4) q4_tile<4>(qs + r * row, k, wt, dt, c0, n, y + r * n);
  for (; r + 2 <= rows; r += 2) q4_tile<2>(qs + r * row, k, wt, dt, c0, n, y + r * n);
  for (; r < rows; ++r) q4_tile<1>(qs + r * row, k, wt, dt, c0, n, y + r * n);
}

}  // namespace vnni
}  // namespace specdec

#pragma GCC pop_options

#else  // not x86: never active, never called

namespace specdec {
namespace vnni {
void q8_rows(const int8_t*, const int32_t*, int64_t, int64_t, const int8_t*, const float*, const float*, const float*,
             int64_t, int64_t, float*) {}
void q8_blocks(const int8_t*, const int32_t*, int64_t, int64_t, const int8_t*, const float*, const float*, const float*,
               int64_t, int64_t, int64_t, float*) {}
void q4_spread(const int8_t*, int64_t, int64_t, int8_t*) {}
void q4_rows(const int8_t*, int64_t, int64_t, const uint8_t*, const c10::Half*, int64_t, int64_t, float*) {}
}  // namespace vnni
}  // namespace specdec

#endif
