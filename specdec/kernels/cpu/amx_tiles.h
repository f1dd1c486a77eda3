// The one AMX tile configuration of the kernels (qlinear_amx.cpp, attention_amx.cpp): palette 1, all eight
// tiles 16 rows of 64 bytes. Include inside an AMX target region; an operand with fewer real rows is padded
// with zeros in memory rather than configured smaller (ldtilecfg per call shape cost more than it saved).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace specdec {
namespace amx_tiles {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

inline void configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

}  // namespace amx_tiles
}  // namespace specdec
