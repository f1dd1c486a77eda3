// The instruction-set switch of isa.h, and the torch op `isa` that reads and sets it.
#include "isa.h"

#include <torch/library.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace specdec {
namespace isa {

namespace {
int active = -1;  // -1 undecided; 0 AVX2; 1 AVX-512
}

bool avx512_supported() {
#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

bool avx512() {
  if (active < 0) {
    const char* forced = std::getenv("SPECDEC_CPU_ISA");  // "avx2": the A/B switch of the benches
    active = avx512_supported() && !(forced && std::strcmp(forced, "avx2") == 0) ? 1 : 0;
  }
  return active == 1;
}

void set_avx512(bool on) { active = on && avx512_supported() ? 1 : 0; }

namespace {
// "avx512" or "avx2" ("scalar" in a build without AVX2). `request`: "" asks only; "avx2" forces the AVX2
// paths; "avx512" restores AVX-512 where the CPU has it.
std::string isa_op(const std::string& request) {
  TORCH_CHECK(request.empty() || request == "avx2" || request == "avx512",
              "isa: request must be '', 'avx2' or 'avx512'");
  if (!request.empty()) set_avx512(request == "avx512");
  if (avx512()) return "avx512";
#if defined(__AVX2__)
  return "avx2";
#else
  return "scalar";
#endif
}
}  // namespace

}  // namespace isa
}  // namespace specdec

TORCH_LIBRARY_FRAGMENT(specdec_cpu, m) { m.def("isa(str request) -> str", &specdec::isa::isa_op); }
