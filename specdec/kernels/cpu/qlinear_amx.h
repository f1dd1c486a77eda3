// The AMX tiles of the int8 linears (qlinear_amx.cpp), chosen at run time by qlinear.cpp.
#pragma once

#include <cstdint>

namespace specdec {
namespace amx {

constexpr int64_t kBlock = 16;  // output channels of a packed weight block (one B tile's columns)
constexpr int64_t kChunk = 64;  // inputs of a packed weight block (one B tile's 16 rows of 4)

constexpr int64_t kRowsPerPass = 64;  // rows one load of a weight tile feeds (four accumulator tiles)

// May run only where isa::amx() (isa.h). All `rows` rows of q [rows, k] (int8, row-major, padded with rows of
// zeros to a multiple of 16: every tile holds 16 rows, whatever the real count) times the weight
// blocks cb0 .. cb1 of `wp`, the layout of specdec.kernels.reference.pack_q8_blocks: y[r, c] = dot * (s[r] *
// ws[c]) (+ b[c]) for the real channels c < n of those blocks, into y [rows, n].
void q8_rows(const int8_t* q, int64_t rows, int64_t k, const int8_t* wp, const float* s, const float* ws,
             const float* b, int64_t cb0, int64_t cb1, int64_t n, float* y);

}  // namespace amx
}  // namespace specdec
