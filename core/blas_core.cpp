// The OpenBLAS core and whether it matches the SIMD level in use.
#include "core/blas_core.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>

extern "C" char* openblas_get_corename(void);

namespace tapegrad {

namespace {

int level_bits(SimdLevel level) {
  switch (level) {
    case SimdLevel::sse2: return 128;
    case SimdLevel::avx2: return 256;
    case SimdLevel::avx512:
    case SimdLevel::emulated16: return 512;
  }
  return 512;
}

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return out;
}

}  // namespace

std::string blas_core_name() {
  static const std::string core = openblas_get_corename();
  return core;
}

int blas_vector_bits(std::string_view core) {
  // OpenBLAS's x86-64 cores with AVX-512 kernels, and with AVX2 + FMA ones (Zen runs Haswell's).
  constexpr std::array<std::string_view, 3> wide = {"skylakex", "cooperlake", "sapphirerapids"};
  constexpr std::array<std::string_view, 2> avx2 = {"haswell", "zen"};
  const std::string name = lower(core);
  if (std::find(wide.begin(), wide.end(), name) != wide.end()) return 512;
  if (std::find(avx2.begin(), avx2.end(), name) != avx2.end()) return 256;
  return 128;
}

bool blas_serves(std::string_view core, SimdLevel level, bool cpu_has_avx2) {
  const int bits = blas_vector_bits(core);
  return bits >= level_bits(level) && !(cpu_has_avx2 && bits < 256);
}

bool blas_serves(SimdLevel level) {
  static const bool cpu_has_avx2 = supported_simd_levels().back() != SimdLevel::sse2;
  return blas_serves(blas_core_name(), level, cpu_has_avx2);
}

std::string blas_mismatch_warning() {
  const SimdLevel level = simd_level();
  if (blas_serves(level)) return {};
  return fmt::format("warning: OpenBLAS runs its {} kernels ({}-bit) on this CPU, at SIMD level {}: gemm runs its own "
                     "packed kernel for every product instead",
                     blas_core_name(), blas_vector_bits(blas_core_name()), simd_level_name(level));
}

}  // namespace tapegrad
