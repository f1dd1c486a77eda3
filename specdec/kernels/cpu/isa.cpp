// The instruction-set switch of isa.h, and the torch op `isa` that reads and sets it.
#include "isa.h"

#include <torch/library.h>

#include <cstdlib>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace specdec {
namespace isa {

namespace {
enum Level { kUndecided = -1, kAvx2 = 0, kAvx512 = 1, kAmx = 2 };
int active = kUndecided;

int best() { return amx_supported() ? kAmx : avx512_supported() ? kAvx512 : kAvx2; }

// The level a request names, capped at what the CPU has: "avx2", "avx512" or "amx".
int level_of(const std::string& name) {
  const int want = name == "amx" ? kAmx : name == "avx512" ? kAvx512 : kAvx2;
  return want < best() ? want : best();
}

int current() {
  if (active == kUndecided) {
    // "avx2", "avx512" or "amx": the A/B switch of the benches; any other value leaves the best level, as an
    // unknown value always has.
    const char* env = std::getenv("SPECDEC_CPU_ISA");
    const std::string forced = env ? env : "";
    active = forced == "avx2" || forced == "avx512" || forced == "amx" ? level_of(forced) : best();
  }
  return active;
}
}  // namespace

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

bool amx_supported() {
#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__) && defined(__linux__)
  static const bool ok = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!avx512_supported() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool tile = edx & (1u << 24), int8 = edx & (1u << 25);
    // Linux hands out the 8 KiB of tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
    // XFEATURE_XTILEDATA); without it the first tile instruction kills the process.
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return tile && int8 && syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

bool amx_bf16_supported() {
#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__) && defined(__linux__)
  static const bool ok = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!amx_supported() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) || !(edx & (1u << 22))) return false;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5));  // AVX512-BF16
  }();
  return ok;
#else
  return false;
#endif
}

bool avx512_bf16_supported() {
#if defined(__x86_64__) && defined(__GNUC__) && defined(__AVX2__)
  static const bool ok = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return avx512_supported() && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5));
  }();
  return ok;
#else
  return false;
#endif
}

bool bf16_tile_attention() { return amx() && amx_bf16_supported(); }

bool bf16_dot_attention() { return avx512() && !bf16_tile_attention() && avx512_bf16_supported(); }

bool bf16_attention() { return bf16_tile_attention() || bf16_dot_attention(); }

bool avx512() { return current() >= kAvx512; }

bool amx() { return current() == kAmx; }

namespace {
// "amx", "avx512" or "avx2" ("scalar" in a build without AVX2). `request`: "" asks only; "avx2", "avx512" or
// "amx" choose that level, or the best below it that the CPU has.
std::string isa_op(const std::string& request) {
  TORCH_CHECK(request.empty() || request == "avx2" || request == "avx512" || request == "amx",
              "isa: request must be '', 'avx2', 'avx512' or 'amx'");
  if (!request.empty()) active = level_of(request);
  if (amx()) return "amx";
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

TORCH_LIBRARY_FRAGMENT(specdec_cpu, m) {
  m.def("isa(str request) -> str", &specdec::isa::isa_op);
  m.def("bf16_attention() -> bool", &specdec::isa::bf16_attention);
}
