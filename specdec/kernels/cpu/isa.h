// Which instruction set the compiled CPU kernels run on, in three levels that give the same bits:
//   avx2    every x86 CPU: the base build of every kernel;
//   avx512  AVX-512 (F, BW, DQ, VL and VNNI): the int8 linears' VNNI tiles (qlinear_vnni.cpp) and attention's
//           wide blocks (attention_rows.h);
//   amx     AVX-512 plus AMX-INT8 with the OS's leave to use its tile registers: the int8 linears multiply
//           whole 16-row tiles (qlinear_amx.cpp); everything else as avx512.
// The switch exists for A/B runs and for the tests that prove the levels agree.
#pragma once

namespace specdec {
namespace isa {

bool avx512_supported();
// AMX-INT8 on this CPU, and the kernel's permission for this process to use the tile data (asked once).
bool amx_supported();
// AMX-BF16 and AVX512-BF16 on this CPU, with the OS's leave for the tiles.
bool amx_bf16_supported();
// AVX512-BF16 on this CPU (vdpbf16ps), besides avx512_supported().
bool avx512_bf16_supported();
// Whether attention over a bfloat16 K/V cache runs on AMX tiles (attention_amx.cpp): the amx level, and AMX-BF16.
bool bf16_tile_attention();
// Whether it runs with AVX512-BF16 dot products (attention_bf16.cpp): the avx512 level, AVX512-BF16, no tiles.
bool bf16_dot_attention();
// Whether attention over a bfloat16 K/V cache can run at all: one of the two above.
bool bf16_attention();
// Whether the AVX-512 paths run now (true at the amx level too): supported, unless SPECDEC_CPU_ISA=avx2 or a
// request chose avx2.
bool avx512();
// Whether the AMX int8 tiles run now: supported, unless SPECDEC_CPU_ISA=avx512 / avx2 or a request chose so.
bool amx();

}  // namespace isa
}  // namespace specdec
