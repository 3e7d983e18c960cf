// Run-time choice of the SIMD level: CPU detection and the TAPEGRAD_SIMD override.
#include "core/simd.h"

#include <cpuid.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace tapegrad {

namespace {

constexpr SimdLevel real_levels[] = {SimdLevel::sse2, SimdLevel::avx2, SimdLevel::avx512};
constexpr SimdLevel all_levels[] = {SimdLevel::sse2, SimdLevel::avx2, SimdLevel::avx512, SimdLevel::emulated16};

#ifndef TAPEGRAD_HAVE_EMULATED16
#error "CMakeLists.txt says whether this build has the emulated16 test level"
#endif

// F16C is CPUID leaf 1, ECX bit 29, asked of CPUID itself: clang 14's __builtin_cpu_supports
// does not know the name "f16c".
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}

// GCC's and clang's CPU checks also ask the OS (XGETBV) whether it saves the wider registers.
bool cpu_supports(SimdLevel level) {
  __builtin_cpu_init();
  switch (level) {
    case SimdLevel::sse2: return true;  // part of x86-64
    case SimdLevel::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case SimdLevel::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             cpu_has_f16c();
    case SimdLevel::emulated16: return TAPEGRAD_HAVE_EMULATED16 && cpu_supports(SimdLevel::avx2);
  }
  return false;
}

SimdLevel check_supported(SimdLevel level, std::string_view origin) {
  if (level == SimdLevel::emulated16 && !TAPEGRAD_HAVE_EMULATED16)
    throw std::runtime_error(fmt::format("{}emulated16: this build has no emulated16 level (a test level, built "
                                         "with the tests: TAPEGRAD_BUILD_TESTS=ON)",
                                         origin));
  if (!cpu_supports(level))
    throw std::runtime_error(fmt::format("{}{}: this CPU does not support {}; it supports {}", origin,
                                         simd_level_name(level), simd_level_name(level), supported_simd_level_names()));
  return level;
}

SimdLevel initial_level() {
  const char* forced = std::getenv("TAPEGRAD_SIMD");
  if (forced == nullptr || *forced == '\0') return supported_simd_levels().back();
  for (SimdLevel level : all_levels)
    if (simd_level_name(level) == forced) return check_supported(level, "TAPEGRAD_SIMD=");
  throw std::runtime_error(fmt::format("TAPEGRAD_SIMD={}: unknown instruction set; use sse2, avx2, avx512 or (a test level) "
                                       "emulated16",
                                       forced));
}

constexpr int unset = -1;
std::atomic<int> current{unset};

}  // namespace

std::string_view simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::sse2: return "sse2";
    case SimdLevel::avx2: return "avx2";
    case SimdLevel::avx512: return "avx512";
    case SimdLevel::emulated16: return "emulated16";
  }
  return "unknown";
}

std::vector<SimdLevel> supported_simd_levels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel level : real_levels)
    if (cpu_supports(level)) levels.push_back(level);
  return levels;
}

std::vector<SimdLevel> testable_simd_levels() {
  std::vector<SimdLevel> levels = supported_simd_levels();
  if (cpu_supports(SimdLevel::emulated16)) levels.push_back(SimdLevel::emulated16);
  return levels;
}

std::string supported_simd_level_names() {
  std::string names;
  for (SimdLevel level : supported_simd_levels()) names += (names.empty() ? "" : ", ") + std::string(simd_level_name(level));
  return names;
}

SimdLevel simd_level() {
  int level = current.load(std::memory_order_relaxed);
  if (level == unset) {
    level = int(initial_level());  // throws on a bad TAPEGRAD_SIMD, every call until it is fixed
    current.store(level, std::memory_order_relaxed);
  }
  return SimdLevel(level);
}

void set_simd_level(SimdLevel level) {
  current.store(int(check_supported(level, "set_simd_level: ")), std::memory_order_relaxed);
}

}  // namespace tapegrad
