// Which instruction set the compiled CPU kernels run on: AVX2 everywhere on x86, and where the CPU has AVX-512
// (F, BW, DQ, VL and VNNI) the int8 linears' VNNI tiles (qlinear_vnni.cpp) and attention's wide blocks
// (attention_rows.h). Both give the same bits; the switch exists for A/B runs and for the tests that prove it.
#pragma once

namespace specdec {
namespace isa {

bool avx512_supported();
// Whether the AVX-512 paths run now: supported, unless SPECDEC_CPU_ISA=avx2 or set_avx512(false).
bool avx512();
void set_avx512(bool on);

}  // namespace isa
}  // namespace specdec
