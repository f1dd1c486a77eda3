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
// The integer-and-scale part of linear_q4 for one tile (qlinear.cpp's q4_tile, all rows); q4_finish follows.
void q4_rows(const int8_t* q, int64_t rows, int64_t k, const uint8_t* wt, const c10::Half* dt, int64_t c0, int64_t n,
             float* y);

}  // namespace vnni
}  // namespace specdec
