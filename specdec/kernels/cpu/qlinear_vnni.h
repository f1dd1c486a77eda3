// The AVX-512 VNNI tiles of the int8 and int4 linears (qlinear_vnni.cpp), chosen at run time by qlinear.cpp.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>

namespace specdec {
namespace vnni {

// Both may run only where isa::avx512() (isa.h).
// All `rows` rows times one tile of four output channels starting at c0 (qlinear.cpp's layouts and meaning);
// `qsum` holds each row's sum of q.
void q8_rows(const int8_t* q, const int32_t* qsum, int64_t rows, int64_t k, const int8_t* wt, const float* s,
             const float* ws, const float* b, int64_t c0, int64_t n, float* y);
// All `rows` rows times the blocks cb0 .. cb1 of 16 channels of `wp`, the AMX kernel's copy of the weights
// (specdec.kernels.reference.pack_q8_blocks), into y [rows, n]: the same dots and float steps as q8_rows.
void q8_blocks(const int8_t* q, const int32_t* qsum, int64_t rows, int64_t k, const int8_t* wp, const float* s,
               const float* ws, const float* b, int64_t cb0, int64_t cb1, int64_t n, float* y);
// int4: each row's activations spread for q4_rows, 64 bytes a group of 32 inputs (inputs 0-15 twice, then
// 16-31 twice): `qs` holds rows * 2k bytes.
void q4_spread(const int8_t* q, int64_t rows, int64_t k, int8_t* qs);
// The integer-and-scale part of linear_q4 for one tile (qlinear.cpp's q4_tile, all rows), from the spread
// activations; q4_finish follows.
void q4_rows(const int8_t* qs, int64_t rows, int64_t k, const uint8_t* wt, const c10::Half* dt, int64_t c0, int64_t n,
             float* y);

}  // namespace vnni
}  // namespace specdec
