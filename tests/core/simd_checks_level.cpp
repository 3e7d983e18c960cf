// The checks of simd_checks.h on xsimd's batches as compiled for one SIMD level (CMakeLists.txt
// builds this file once per level, like the kernels).
#include <xsimd/xsimd.hpp>

#include "tests/core/simd_checks.h"

namespace tapegrad::simd_checks::TAPEGRAD_SIMD_LEVEL {

std::vector<std::string> run() {
  Failures f;
#ifdef __FMA__
  constexpr bool fused_fma = true;  // the level has the instruction
#else
  constexpr bool fused_fma = false;
#endif
  check_primitives<xsimd::batch<float>>(f, "float", fused_fma);
  check_primitives<xsimd::batch<double>>(f, "double", fused_fma);
  check_helpers<xsimd::batch<float>>(f, "float");
  check_helpers<xsimd::batch<double>>(f, "double");
  return f.messages;
}

std::size_t float_lanes() { return xsimd::batch<float>::size; }

}  // namespace tapegrad::simd_checks::TAPEGRAD_SIMD_LEVEL
