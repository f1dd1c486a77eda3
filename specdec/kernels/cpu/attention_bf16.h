// Attention over a bfloat16 K/V cache, the two kernels attention.cpp chooses between: on AMX tiles
// (attention_amx.cpp, where isa::bf16_tile_attention()) and with AVX512-BF16 dot products (attention_bf16.cpp,
// where isa::bf16_dot_attention(); isa.h). Same arithmetic definitions, not the same bits.
#pragma once

#include <cstdint>

namespace specdec {

// The attention of query rows r0 .. r0 + rows of one sequence for KV head h, as attention.cpp's attend_rows:
// `group` query heads a row (q and out are float32 [T, q_heads, D]), the `p` committed keys at element offsets
// `prefix` of k_base / v_base (bfloat16 bits), then the new tokens' keys at `new_keys`, of which row r sees the
// `count[r]` listed at visible[r * n_new ..], as indices into new_keys in node order. D must be a multiple of 32.
using AttendRowsBf16 = void(const float* q, float* out, int64_t r0, int64_t rows, int64_t q_heads, int64_t h,
                            int64_t group, const uint16_t* k_base, const uint16_t* v_base, const int64_t* prefix,
                            int64_t p, const int64_t* new_keys, int64_t n_new, const int64_t* visible,
                            const int64_t* count, int64_t d, float scale);

namespace amx_attention {
AttendRowsBf16 attend_rows;
}  // namespace amx_attention

namespace bf16_attention {
AttendRowsBf16 attend_rows;
}  // namespace bf16_attention

}  // namespace specdec
