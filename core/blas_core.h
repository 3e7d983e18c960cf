// Which OpenBLAS kernels run on this machine, and whether gemm may hand them products. OpenBLAS
// picks its kernels ("core") from the CPU model, or from OPENBLAS_CORETYPE; a CPU it does not know
// gets old ones (0.3.21 runs Prescott's 128-bit SSE3 kernels on Emerald Rapids), and a product
// handed to them runs at a fraction of what the level's own packed kernel does.
#pragma once

#include <string>
#include <string_view>

#include "core/simd.h"

namespace tapegrad {

/// The core OpenBLAS runs, as it names it: "Haswell", "SkylakeX", "Prescott".
std::string blas_core_name();
/// The width in bits of a core's vector kernels: 512, 256 or 128 (a core this list does not know
/// counts as 128).
int blas_vector_bits(std::string_view core);
/// Whether gemm may hand products to a BLAS with `core` at `level`: its kernels are at least as
/// wide as the level's, and not older than the CPU (128-bit kernels on a CPU with AVX2).
bool blas_serves(std::string_view core, SimdLevel level, bool cpu_has_avx2);
/// blas_serves for this machine's core and CPU.
bool blas_serves(SimdLevel level);
/// Empty when the BLAS serves the level in use; otherwise a warning line that names the core and
/// the level, for the benchmarks to print.
std::string blas_mismatch_warning();

}  // namespace tapegrad
