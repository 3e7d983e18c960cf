// Private to the bf16 products (core/kernels/matmul_bf16.cpp, matmul_bf16_amx.cpp, the fused head
// of linear_cross_entropy.cpp and the packed BF16 kernel, quant_matmul_bf16.cpp): the operand
// rounding and chain step every path shares, the AMX path's entry points and the shared operand of
// several products (Note [bf16 products]).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "core/aligned.h"
#include "core/bf16.h"
#include "core/kernels/level.h"
#include "core/tensor.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

/// The bf16 bits of x, subnormals flushed to a zero of x's sign: what every path reads.
inline std::uint16_t bf16_operand(float x) {
  std::uint16_t bits = to_bf16_bits(x);
  return (bits & 0x7F80) == 0 ? std::uint16_t(bits & 0x8000) : bits;
}

#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
/// bf16_operand of 16 floats' bits, one per 32-bit lane (in its low half): rounded to nearest
/// even, a NaN kept quiet, a subnormal result flushed to a zero of its sign (core/bf16.h).
inline __m512i operand_lanes(__m512i bits) {
  const __m512i one = _mm512_set1_epi32(1), exponent = _mm512_set1_epi32(0x7F80);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  const __m512i upper = _mm512_srli_epi32(bits, 16);
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(upper, one));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
  rounded = _mm512_mask_or_epi32(rounded, nan, upper, _mm512_set1_epi32(0x40));
  const __mmask16 subnormal = _mm512_testn_epi32_mask(rounded, exponent);
  return _mm512_mask_and_epi32(rounded, subnormal, rounded, _mm512_set1_epi32(0x8000));
}

/// The operand lanes of count (0..16) floats from x, zeros past them.
inline __m512i operand_lanes(const float* x, std::size_t count) {
  const __mmask16 mask = count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
  return operand_lanes(_mm512_maskz_loadu_epi32(mask, x));
}
#endif

// Sets MXCSR's flush-to-zero and denormals-are-zero bits on this thread while it lives.
class FlushSubnormals {
 public:
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | flush_to_zero | denormals_are_zero); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  static constexpr unsigned flush_to_zero = 0x8000, denormals_are_zero = 0x0040;
  unsigned saved_;
};

// One step of a chain, acc + x y rounded once (x y is exact).
template <class V>
V chain_step(const V& acc, const V& x, const V& y) {
#ifdef __FMA__
  return fma(x, y, acc);
#else  // SSE2: no fma; four lanes as two pairs of doubles
  __m128 a = acc, p = x, q = y;
  __m128d low = _mm_add_pd(_mm_cvtps_pd(a), _mm_mul_pd(_mm_cvtps_pd(p), _mm_cvtps_pd(q)));
  __m128d high = _mm_add_pd(_mm_cvtps_pd(_mm_movehl_ps(a, a)),
                            _mm_mul_pd(_mm_cvtps_pd(_mm_movehl_ps(p, p)), _mm_cvtps_pd(_mm_movehl_ps(q, q))));
  return V(_mm_movelh_ps(_mm_cvtpd_ps(low), _mm_cvtpd_ps(high)));
#endif
}

#if defined(__AVX512F__) && !defined(TAPEGRAD_EMULATED_BATCH)
/// Whether this CPU has AVX512_BF16's VDPBF16PS.
bool cpu_has_bf16_dot_products();
/// Whether VDPBF16PS's tile outruns the FMA chain's on this CPU (timed, about 50 us; callers keep
/// the answer).
bool instruction_outruns_chain();
#endif

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
/// With packed_b, op(B) is not read: its column tiles come from packed_b (amx_pack_columns of the
/// whole op(B)), C's column 0 being op(B)'s column packed_j0 (a multiple of 16).
void amx_bf16_product(bool transpose_a, bool transpose_b, std::size_t M, std::size_t N, std::size_t K, const float* A,
                      std::size_t lda, const float* B, std::size_t ldb, bool accumulate, float* C, std::size_t ldc,
                      const std::uint16_t* packed_b = nullptr, std::size_t packed_j0 = 0);

/// The elements amx_pack_columns writes for op(B) (K, N).
std::size_t amx_packed_columns_size(std::size_t K, std::size_t N);
/// op(B) (K, N) rounded and packed into AMX column tiles, for amx_bf16_product's packed_b.
void amx_pack_columns(std::uint16_t* packed, const float* B, bool transpose_b, std::size_t ldb, std::size_t K,
                      std::size_t N);
#endif

/// op(B) of several bf16_gemm products that share it (the vocabulary projection's weight over
/// the chunks of a loss): rounded and packed once where bf16_gemm runs on AMX tiles or VDPBF16PS,
/// the floats as given on the FMA chain's path. Its products have bf16_gemm's bits.
class SharedBf16Operand {
 public:
  /// op(B) (K, N): B (K, N), or B (N, K) when transpose_b, rows ldb apart; B must outlive this.
  SharedBf16Operand(bool transpose_b, std::size_t K, std::size_t N, const float* B, std::size_t ldb);
  /// C (M, N) = op(A) op(B) (+ C when accumulating), over the kernel threads: bf16_gemm's bits.
  void product(bool transpose_a, std::size_t M, const float* A, std::size_t lda, bool accumulate, float* C,
               std::size_t ldc) const;

 private:
  bool transpose_b_;
  std::size_t K_, N_;
  const float* B_;
  std::size_t ldb_;
  // op(B) rounded and packed for bf16_gemm's path (AMX column tiles, or VDPBF16PS's panels), in
  // storage from the tensors' cache (the fused head makes two of 56 MB every step: 27,600 page
  // faults a step when they were fresh); null on the FMA chain's path.
  std::unique_ptr<float[], StorageDeleter> storage_;
  std::uint16_t* packed_ = nullptr;
};

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
