// Private to core/kernels/: the SIMD primitives every width-generic kernel helper builds on (one
// rounding fma at every width, partial loads and stores). Each is a template on the batch type B
// (xsimd::batch<T, Arch>, or the emulated wide batch of the tests), so the same code runs at 2, 4,
// 8 and 16 lanes; tests/core/test_simd.cpp checks each against a scalar loop at every level. fma,
// max, exp and hadd are called unqualified so that a test batch type supplies its own by
// argument-dependent lookup.
//
// Every kernel follows the position rule (docs/architecture.md, "Position independence"): a
// loop's last, partial vector goes through the body's vector code, padded (load_partial), and
// only its valid lanes are stored (store_partial) or summed (first_lanes).
#pragma once

#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace tapegrad::detail {

using xsimd::exp;
using xsimd::fma;
using xsimd::hadd;
using xsimd::max;

// xsimd 8.1 has no AVX-512 fma: its generic one is x * y + z, two roundings (and the kernels are
// compiled with -ffp-contract=off, so the compiler does not fuse it either). A kernel's fma means
// one rounding at every width, as AVX2's and the emulated batch's do: 16-lane batches get the
// instruction. More specialized than xsimd's template, so unqualified calls pick these.
#ifdef __AVX512F__
template <class A>
  requires std::is_base_of_v<xsimd::avx512f, A>
xsimd::batch<float, A> fma(const xsimd::batch<float, A>& x, const xsimd::batch<float, A>& y,
                           const xsimd::batch<float, A>& z) {
  return _mm512_fmadd_ps(x, y, z);
}
template <class A>
  requires std::is_base_of_v<xsimd::avx512f, A>
xsimd::batch<double, A> fma(const xsimd::batch<double, A>& x, const xsimd::batch<double, A>& y,
                            const xsimd::batch<double, A>& z) {
  return _mm512_fmadd_pd(x, y, z);
}
#endif

// The partial vectors below are one masked instruction where the level has one (AVX-512's mask
// registers, AVX2's maskload/maskstore, which never touch the lanes they leave out), and a loop
// through a stack buffer elsewhere (SSE2, the tests' emulated batches): the same lanes either way.
template <class B>
concept avx512_batch = requires { typename B::arch_type; } && std::is_base_of_v<xsimd::avx512f, typename B::arch_type>;
template <class B>
concept avx2_batch = requires { typename B::arch_type; } && std::is_base_of_v<xsimd::avx2, typename B::arch_type>;

#ifdef __AVX512F__
inline __mmask16 lanes_below(std::size_t count) { return __mmask16((1u << count) - 1); }  // count <= 16
#endif
#ifdef __AVX2__
// All ones in the 32-bit (or 64-bit, for double) lanes below count.
template <class T>
__m256i lanes_below(std::size_t count) {
  if constexpr (sizeof(T) == 4)
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  else
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(std::int64_t(count)), _mm256_setr_epi64x(0, 1, 2, 3));
}
#endif

/// A batch of x[0:count] (count <= B::size) in its first lanes, zeros in the rest; x[count:] is
/// never read.
template <class B>
B load_partial(const typename B::value_type* x, std::size_t count) {
  using T = typename B::value_type;
#ifdef __AVX512F__
  if constexpr (avx512_batch<B>) {
    if constexpr (sizeof(T) == 4) return _mm512_maskz_loadu_ps(lanes_below(count), x);
    else return _mm512_maskz_loadu_pd(__mmask8(lanes_below(count)), x);
  }
#endif
#ifdef __AVX2__
  if constexpr (avx2_batch<B>) {
    if constexpr (sizeof(T) == 4) return _mm256_maskload_ps(x, lanes_below<T>(count));
    else return _mm256_maskload_pd(x, lanes_below<T>(count));
  }
#endif
  // (Fixed-count lane loops: std::copy_n with a run-time count becomes a call to memcpy.)
  alignas(64) T lanes[B::size];
  for (std::size_t i = 0; i < B::size; ++i) lanes[i] = i < count ? x[i] : T(0);
  return B::load_aligned(lanes);
}

/// x[0:count] = the first count lanes of b; x[count:] is never written.
template <class B>
void store_partial(const B& b, typename B::value_type* x, std::size_t count) {
  using T = typename B::value_type;
#ifdef __AVX512F__
  if constexpr (avx512_batch<B>) {
    if constexpr (sizeof(T) == 4) return _mm512_mask_storeu_ps(x, lanes_below(count), b);
    else return _mm512_mask_storeu_pd(x, __mmask8(lanes_below(count)), b);
  }
#endif
#ifdef __AVX2__
  if constexpr (avx2_batch<B>) {
    if constexpr (sizeof(T) == 4) return _mm256_maskstore_ps(x, lanes_below<T>(count), b);
    else return _mm256_maskstore_pd(x, lanes_below<T>(count), b);
  }
#endif
  alignas(64) T lanes[B::size];
  b.store_aligned(lanes);
  for (std::size_t i = 0; i < B::size; ++i)
    if (i < count) x[i] = lanes[i];
}

/// b with the lanes from count on set to zero: a padded batch's terms, kept out of a sum.
template <class B>
B first_lanes(const B& b, std::size_t count) {
  using T = typename B::value_type;
  if (count == B::size) return b;
#ifdef __AVX512F__
  if constexpr (avx512_batch<B>) {
    if constexpr (sizeof(T) == 4) return _mm512_maskz_mov_ps(lanes_below(count), b);
    else return _mm512_maskz_mov_pd(__mmask8(lanes_below(count)), b);
  }
#endif
#ifdef __AVX2__
  if constexpr (avx2_batch<B>) {
    if constexpr (sizeof(T) == 4) return _mm256_and_ps(b, _mm256_castsi256_ps(lanes_below<T>(count)));
    else return _mm256_and_pd(b, _mm256_castsi256_pd(lanes_below<T>(count)));
  }
#endif
  alignas(64) T lanes[B::size];
  b.store_aligned(lanes);
  std::fill(lanes + count, lanes + B::size, T(0));
  return B::load_aligned(lanes);
}

/// The count = min(B::size, n) elements of x from which a loop over n elements loads its vector:
/// a whole load in the body, a padded one at the end.
template <class B>
B load_lanes(const typename B::value_type* x, std::size_t count) {
  return count == B::size ? B::load_unaligned(x) : load_partial<B>(x, count);
}
template <class B>
void store_lanes(const B& b, typename B::value_type* x, std::size_t count) {
  if (count == B::size) b.store_unaligned(x);
  else store_partial(b, x, count);
}

// ---- IEEE half (binary16) values, as a 16-bit KV cache holds them ---------------------------------

/// Half bits to float, exactly: the half's exponent and mantissa moved into a float's and scaled by
/// 2^112; a subnormal half becomes a subnormal float first, whose scaling is exact too.
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000) << 16, bits = std::uint32_t(h & 0x7FFF) << 13;
  if ((h & 0x7C00) == 0x7C00) return std::bit_cast<float>(sign | 0x7F800000u | bits);  // inf, NaN
  return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(std::bit_cast<float>(bits) * 0x1p112f));
}

/// Float to half bits as F16C's vcvtps2ph rounds to nearest even: from 65520 on an infinity, below
/// 2^-14 a subnormal or zero, a NaN made quiet with its sign and top 9 payload bits.
inline std::uint16_t float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f), a = x & 0x7FFFFFFF;
  const auto sign = std::uint16_t((x >> 16) & 0x8000);
  if (a > 0x7F800000) return std::uint16_t(sign | 0x7E00 | ((a >> 13) & 0x3FF));
  if (a >= 0x477FF000) return std::uint16_t(sign | 0x7C00);
  if (a >= 0x38800000) {  // a normal half: the exponent rebiased (127 -> 15), 13 bits rounded off
    const std::uint32_t v = a - (112u << 23);
    return std::uint16_t(sign | ((v + 0xFFF + ((v >> 13) & 1)) >> 13));
  }
  // A subnormal half counts units of 2^-24: adding 0.5 (whose ulp is 2^-24) rounds to them.
  return std::uint16_t(sign | (std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3F000000u));
}

/// B::size halves at h widened to B's values, exactly: F16C's instruction on the level's own float
/// batch, the lanes one at a time otherwise (SSE2, the emulated batch, double).
template <class B>
B load_halves(const std::uint16_t* h) {
  using T = typename B::value_type;
#if defined(__AVX512F__) && defined(__F16C__)
  if constexpr (avx512_batch<B> && sizeof(T) == 4)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
#endif
#if defined(__AVX2__) && defined(__F16C__)
  if constexpr (avx2_batch<B> && sizeof(T) == 4)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
#endif
  alignas(64) T lanes[B::size];
  for (std::size_t i = 0; i < B::size; ++i) lanes[i] = T(half_to_float(h[i]));
  return B::load_aligned(lanes);
}

/// h[0:B::size] = b's lanes rounded to halves as float_to_half does (a double lane rounded to float first).
template <class B>
void store_halves(const B& b, std::uint16_t* h) {
  using T = typename B::value_type;
#if defined(__AVX512F__) && defined(__F16C__)
  if constexpr (avx512_batch<B> && sizeof(T) == 4)
    return _mm256_storeu_si256(reinterpret_cast<__m256i*>(h),
                               _mm512_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
#if defined(__AVX2__) && defined(__F16C__)
  if constexpr (avx2_batch<B> && sizeof(T) == 4)
    return _mm_storeu_si128(reinterpret_cast<__m128i*>(h),
                            _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  alignas(64) T lanes[B::size];
  b.store_aligned(lanes);
  for (std::size_t i = 0; i < B::size; ++i) h[i] = float_to_half(float(lanes[i]));
}

/// B::size values of a KV cache's row at p: floats as they are, halves widened (load_halves).
template <class B, class S>
B load_stored(const S* p) {
  if constexpr (std::is_same_v<S, std::uint16_t>) return load_halves<B>(p);
  else return B::load_unaligned(p);
}

}  // namespace tapegrad::detail
