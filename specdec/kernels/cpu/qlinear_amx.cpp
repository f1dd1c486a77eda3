// The int8 linears on AMX: one instruction (tdpbssd) multiplies a tile of up to 16 activation rows by 64
// inputs with a tile of 64 inputs by 16 output channels, 16,384 exact int8 products summed into int32.
//
// Why it matters: verifying a token tree multiplies every weight by one activation row per node. With AVX-512
// VNNI (qlinear_vnni.cpp) each extra row still costs one instruction per 64 products (on the Xeon this was
// written on, 8 rows of SmolLM2's linears cost 1.25x one row); a tile takes 1 to 16 rows for the same
// instructions, so the weights' trip from memory is the whole cost at any row count up to 16 (1.02-1.04x at 8).
//
// The weights are a second copy in their own layout (specdec.kernels.reference.pack_q8_blocks, built at load by
// QLinear where the CPU has AVX-512 VNNI or AMX; the VNNI kernel reads it for one row): per block of 16 channels
// and 64 inputs, the tile's 16 rows of 64 bytes, row i holding inputs 4i .. 4i + 3 of each channel in turn,
// blocks in input order, so each block of channels is one sequential stream. The activations are read in place
// (q [rows, k] is row-major).
//
// Same bits as the other paths: tdpbssd multiplies signed bytes by signed bytes exactly and sums in int32,
// so each dot is the exact integer every path computes (no 128-offset needed), and the float steps after it
// are the VNNI tile's: float(dot) * (s[r] * ws[c]), then + b[c] (tests/kernels/test_isa.py).
#include "qlinear_amx.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__) && defined(__linux__)
#define SPECDEC_AMX 1
#include <immintrin.h>
#endif

#include <algorithm>

#if defined(SPECDEC_AMX)
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512dq,avx512vl")
#include "amx_tiles.h"

namespace specdec {
namespace amx {
namespace {

// The 64-byte tile configuration (palette 1): accumulators C in tmm0 .. tmm3 (16 rows of 16 int32 each), the
// activations A in tmm4 and tmm5 and the weights B in tmm6 and tmm7 (16 rows of 64 bytes each), the two pairs
// taking steps of 64 inputs in turn, so that the next step's loads need not wait for this step's multiply to
// have read its registers. One configuration for every call: reconfiguring per row block (ldtilecfg) cost
// more than the arithmetic it saved.
//
// Weight tiles ahead to prefetch: 2 and 4 measured 3-5% faster than none (the hardware's streamer alone) and
// than 8 or 16, at 1-8 rows (bench/int8_rows.py, rebuilt for each distance).
constexpr int64_t kAhead = 2;

using amx_tiles::configure;

// dots [m, 16] of one block row -> y, the VNNI tile's float steps, sixteen channels at once where all are real.
void finish(const int32_t* dots, int64_t m, const float* s, const float* ws, const float* b, int64_t c0, int64_t n,
            float* y) {
  const int64_t width = std::min<int64_t>(kBlock, n - c0);
  const __mmask16 mask = static_cast<__mmask16>((1u << width) - 1);
  const __m512 w = _mm512_maskz_loadu_ps(mask, ws + c0);
  const __m512 bias = b ? _mm512_maskz_loadu_ps(mask, b + c0) : _mm512_setzero_ps();
  for (int64_t r = 0; r < m; ++r) {
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(dots + r * kBlock)),
                             _mm512_mul_ps(_mm512_set1_ps(s[r]), w));
    if (b) v = _mm512_add_ps(v, bias);
    _mm512_mask_storeu_ps(y + r * n + c0, mask, v);
  }
}

}  // namespace

void q8_rows(const int8_t* q, int64_t rows, int64_t k, const int8_t* wp, const float* s, const float* ws,
             const float* b, int64_t cb0, int64_t cb1, int64_t n, float* y) {
  const int64_t chunks = k / kChunk;
  alignas(64) int32_t dots[kBlock * kBlock];
  configure();
  // Channel blocks outer, groups of up to four row blocks inner: one load of a weight tile feeds up to 64 rows,
  // and a block's weights (k x 16 bytes) stay in cache for the next group of a prefill chunk's rows.
  for (int64_t cb = cb0; cb < cb1; ++cb) {
    const int8_t* wb = wp + cb * chunks * kChunk * kBlock;
    for (int64_t r0 = 0; r0 < rows; r0 += kRowsPerPass) {
      const int64_t blocks = std::min<int64_t>(kRowsPerPass, rows - r0 + kBlock - 1) / kBlock;
      const int8_t* qr = q + r0 * k;
      _tile_zero(0);
      if (blocks > 1) _tile_zero(1);
      if (blocks > 2) _tile_zero(2);
      if (blocks > 3) _tile_zero(3);
      // One step: the weight tile of inputs 64j .. 64j + 63 into B, then each row block's activations into A
      // and its product into its accumulator.
#define SPECDEC_AMX_STEP(A, B, j)                                                                          \
  do {                                                                                                     \
    const char* ahead = reinterpret_cast<const char*>(wb + ((j) + kAhead) * kChunk * kBlock);              \
    for (int l = 0; l < 16; ++l) _mm_prefetch(ahead + 64 * l, _MM_HINT_T0); /* never faults past the end */ \
    _tile_loadd(B, wb + (j) * kChunk * kBlock, 64);                                                        \
    _tile_loadd(A, qr + (j) * kChunk, k);                                                                  \
    _tile_dpbssd(0, A, B);                                                                                 \
    if (blocks > 1) {                                                                                      \
      _tile_loadd(A, qr + kBlock * k + (j) * kChunk, k);                                                   \
      _tile_dpbssd(1, A, B);                                                                               \
    }                                                                                                      \
    if (blocks > 2) {                                                                                      \
      _tile_loadd(A, qr + 2 * kBlock * k + (j) * kChunk, k);                                               \
      _tile_dpbssd(2, A, B);                                                                               \
    }                                                                                                      \
    if (blocks > 3) {                                                                                      \
      _tile_loadd(A, qr + 3 * kBlock * k + (j) * kChunk, k);                                               \
      _tile_dpbssd(3, A, B);                                                                               \
    }                                                                                                      \
  } while (0)
      int64_t j = 0;
      for (; j + 2 <= chunks; j += 2) {
        SPECDEC_AMX_STEP(4, 6, j);
        SPECDEC_AMX_STEP(5, 7, j + 1);
      }
      if (j < chunks) SPECDEC_AMX_STEP(4, 6, j);
#undef SPECDEC_AMX_STEP
      for (int64_t t = 0; t < blocks; ++t) {
        if (t == 0) _tile_stored(0, dots, 64);
        if (t == 1) _tile_stored(1, dots, 64);
        if (t == 2) _tile_stored(2, dots, 64);
        if (t == 3) _tile_stored(3, dots, 64);
        const int64_t rb = r0 + t * kBlock;
        finish(dots, std::min<int64_t>(kBlock, rows - rb), s + rb, ws, b, cb * kBlock, n, y + rb * n);
      }
    }
  }
  _tile_release();
}

}  // namespace amx
}  // namespace specdec

#pragma GCC pop_options

#else  // no AMX build: never active, never called

namespace specdec {
namespace amx {
void q8_rows(const int8_t*, int64_t, int64_t, const int8_t*, const float*, const float*, const float*, int64_t,
             int64_t, int64_t, float*) {}
}  // namespace amx
}  // namespace specdec

#endif
