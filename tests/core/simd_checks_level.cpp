// The checks of simd_checks.h on xsimd's batches as compiled for one SIMD level (CMakeLists.txt
// builds this file once per level, like the kernels).
#include <xsimd/xsimd.hpp>

#include "tests/core/simd_checks.h"

namespace tapegrad::simd_checks::TAPEGRAD_SIMD_LEVEL {

std::vector<std::string> run() {
  Failures f;
  check_primitives<xsimd::batch<float>>(f, "float");
  check_primitives<xsimd::batch<double>>(f, "double");
  check_helpers<xsimd::batch<float>>(f, "float");
  check_helpers<xsimd::batch<double>>(f, "double");
  return f.messages;
}

std::size_t float_lanes() { return xsimd::batch<float>::size; }

}  // namespace tapegrad::simd_checks::TAPEGRAD_SIMD_LEVEL
