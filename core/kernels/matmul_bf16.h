// Private to the bf16 products (core/kernels/matmul_bf16.cpp, matmul_bf16_amx.cpp): the operand
// rounding every path shares and the AMX path's entry points (Note [bf16 products]).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/bf16.h"
#include "core/kernels/level.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

/// The bf16 bits of x, subnormals flushed to a zero of x's sign: what every path reads.
inline std::uint16_t bf16_operand(float x) {
  std::uint16_t bits = to_bf16_bits(x);
  return (bits & 0x7F80) == 0 ? std::uint16_t(bits & 0x8000) : bits;
}

// The AMX path exists at the AVX-512 level, on Linux (which hands out the tile state).
#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH) && defined(__linux__)
#define TAPEGRAD_BF16_AMX 1
#else
#define TAPEGRAD_BF16_AMX 0
#endif

#if TAPEGRAD_BF16_AMX
/// Whether this CPU has AMX-BF16 and the operating system gave this process the tile state
/// (asked once).
bool amx_tiles_usable();

/// bf16_gemm's contract on AMX tiles, on this thread, for K > 0; only where amx_tiles_usable().
void amx_bf16_product(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const float* A,
                      std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C, std::size_t ldc);
#endif

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
