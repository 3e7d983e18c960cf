// This level's packed_matmul kernels (core/quant/packed_kernels.h): y = x W^T for W in a block
// format (integer dot products on 8-bit activation blocks) or in BF16 / F16 (float products), each
// output computed as Note [Packed products] fixes it. Every level has a portable version (plain
// loops: SSE2 and emulated16 run it); AVX2 forms the integer sums with vpmaddubsw, AVX-512 with
// VNNI's vpdpbusd two blocks at a time (AVX2's kernels where the CPU lacks VNNI).
#include <bit>
#include <cstring>

#include "core/kernels/level.h"
#include "core/quant/packed_kernels.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

namespace {

using quant::ActivationRows;
using quant::PackedMatrix;
using quant::TensorType;

std::uint16_t load_u16(const std::byte* p) { return std::uint16_t(unsigned(p[0]) | (unsigned(p[1]) << 8)); }

// IEEE half to float, exactly (block_format.h's f16_to_f32, without its loop): the half's
// exponent and mantissa moved into a float's and scaled by 2^112; a subnormal half becomes a
// subnormal float first, whose scaling is exact too.
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000) << 16, bits = std::uint32_t(h & 0x7FFF) << 13;
  if ((h & 0x7C00) == 0x7C00) return std::bit_cast<float>(sign | 0x7F800000u | bits);  // inf, NaN
  return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(std::bit_cast<float>(bits) * 0x1p112f));
}

// The layout of a block format's blocks of 32 (core/quant/block_format.cpp): bytes per block, where
// the codes start, the offset subtracted from the unsigned codes, and whether a minimum follows d.
template <TensorType type> struct Blocks;
template <> struct Blocks<TensorType::Q4_0> {
  static constexpr std::size_t bytes = 18, codes = 2;
  static constexpr int offset = 8, shift = 3;  // offset = 1 << shift
  static constexpr bool nibbles = true, has_min = false;
};
template <> struct Blocks<TensorType::Q4_1> {
  static constexpr std::size_t bytes = 20, codes = 4;
  static constexpr int offset = 0, shift = 0;
  static constexpr bool nibbles = true, has_min = true;
};
template <> struct Blocks<TensorType::Q8_0> {
  static constexpr std::size_t bytes = 34, codes = 2;
  static constexpr int offset = 128, shift = 7;
  static constexpr bool nibbles = false, has_min = false;
};

// y = the lanes' tree sum (Note [Packed products]), plus y's old value when accumulating.
inline void store_sum(float* y, const float t[16], bool accumulate) {
  float t8[8], t4[4];
  for (int l = 0; l < 8; ++l) t8[l] = t[l] + t[l + 8];
  for (int l = 0; l < 4; ++l) t4[l] = t8[l] + t8[l + 4];
  const float sum = (t4[0] + t4[2]) + (t4[1] + t4[3]);
  *y = accumulate ? *y + sum : sum;
}

// ---- portable: the definition, in plain loops --------------------------------------------------

template <TensorType type>
void block_rows_portable(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w,
                         std::size_t first, std::size_t last, bool accumulate) {
  using B = Blocks<type>;
  const std::size_t blocks = w.cols / 32;
  for (std::size_t n = first; n < last; ++n) {
    const std::byte* row = w.row(n);
    for (std::size_t m = 0; m < x.rows; ++m) {
      const std::int8_t* q = x.q + m * x.blocks * 32;
      const std::int32_t* neg_sums = x.neg_sums + m * x.blocks * 8;
      const float* d = x.d + m * x.blocks * 8;
      const float* scaled_sums = x.scaled_sums + m * x.blocks * 8;
      float acc[16] = {}, acc2[16] = {};
      for (std::size_t b = 0; b < blocks; ++b) {
        const std::byte* block = row + b * B::bytes;
        std::uint8_t u[32];
        for (int j = 0; j < 16 && B::nibbles; ++j) {
          u[j] = std::uint8_t(unsigned(block[B::codes + j]) & 0xF);
          u[j + 16] = std::uint8_t(unsigned(block[B::codes + j]) >> 4);
        }
        for (int j = 0; j < 32 && !B::nibbles; ++j) u[j] = std::uint8_t(unsigned(block[B::codes + j]) ^ 0x80);
        const float scale = half_to_float(load_u16(block)) * d[8 * b];
        for (std::size_t g = 0; g < 8; ++g) {
          std::int32_t sum = B::offset * neg_sums[8 * b + g];
          for (std::size_t j = 4 * g; j < 4 * g + 4; ++j) sum += std::int32_t(u[j]) * q[32 * b + j];
          acc[(b % 2) * 8 + g] += float(sum) * scale;
        }
        if constexpr (B::has_min) {
          const float min = half_to_float(load_u16(block + 2));
          for (std::size_t g = 0; g < 8; ++g) acc2[(b % 2) * 8 + g] += min * scaled_sums[8 * b + g];
        }
      }
      if constexpr (B::has_min)
        for (int l = 0; l < 16; ++l) acc[l] += acc2[l];
      store_sum(y + m * ldy + n, acc, accumulate);
    }
  }
}

template <TensorType type> float weight_at(const std::byte* row, std::size_t k) {
  const std::uint16_t bits = load_u16(row + 2 * k);
  if constexpr (type == TensorType::BF16) return std::bit_cast<float>(std::uint32_t(bits) << 16);
  else return half_to_float(bits);
}

template <TensorType type>
void float_rows_portable(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w,
                         std::size_t first, std::size_t last, bool accumulate) {
  for (std::size_t n = first; n < last; ++n)
    for (std::size_t m = 0; m < x.rows; ++m) {
      const float* xm = x.x + m * x.cols;
      float acc[16] = {};
      for (std::size_t k = 0; k < w.cols; ++k) acc[k % 16] += weight_at<type>(w.row(n), k) * xm[k];
      store_sum(y + m * ldy + n, acc, accumulate);
    }
}

#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)

// ---- AVX2: blocks one at a time, integer sums by vpmaddubsw + vpmaddwd --------------------------

// y = the tree of lanes lo (0-7) and hi (8-15), as store_sum.
inline void store_sum256(float* y, __m256 lo, __m256 hi, bool accumulate) {
  const __m256 t8 = _mm256_add_ps(lo, hi);
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));  // t4[0] + t4[2], t4[1] + t4[3]
  const float sum = _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
  *y = accumulate ? *y + sum : sum;
}

// The eight group sums L[b][g] of one block (Note [Packed products]).
template <TensorType type> __m256i group_sums256(const std::byte* block, const std::int8_t* q, const std::int32_t* neg_sums) {
  using B = Blocks<type>;
  const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (!B::nibbles) {  // signed codes: |w| times q with w's sign, pairs below 2 * 128 * 127
    const __m256i ws = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + B::codes));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(ws), _mm256_sign_epi8(xq, ws)), ones);
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + B::codes));
    const __m128i low = _mm_set1_epi8(0xF);
    const __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
    const __m256i sums = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xq), ones);  // pairs below 2 * 15 * 127
    if constexpr (B::offset == 0) return sums;
    else return _mm256_add_epi32(sums, _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(neg_sums)), B::shift));
  }
}

template <TensorType type>
void block_rows_avx2(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                     std::size_t last, bool accumulate) {
  using B = Blocks<type>;
  const std::size_t blocks = w.cols / 32;
  for (std::size_t n = first; n < last; ++n) {
    const std::byte* row = w.row(n);
    for (std::size_t m = 0; m < x.rows; ++m) {
      const std::int8_t* q = x.q + m * x.blocks * 32;
      const std::int32_t* neg_sums = x.neg_sums + m * x.blocks * 8;
      const float* d = x.d + m * x.blocks * 8;
      const float* scaled_sums = x.scaled_sums + m * x.blocks * 8;
      __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, acc2[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
      for (std::size_t b = 0; b < blocks; ++b) {
        const std::byte* block = row + b * B::bytes;
        const __m256i sums = group_sums256<type>(block, q + 32 * b, neg_sums + 8 * b);
        const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(half_to_float(load_u16(block))), _mm256_loadu_ps(d + 8 * b));
        acc[b % 2] = _mm256_add_ps(acc[b % 2], _mm256_mul_ps(_mm256_cvtepi32_ps(sums), scale));
        if constexpr (B::has_min)
          acc2[b % 2] = _mm256_add_ps(acc2[b % 2], _mm256_mul_ps(_mm256_set1_ps(half_to_float(load_u16(block + 2))),
                                                                 _mm256_loadu_ps(scaled_sums + 8 * b)));
      }
      if constexpr (B::has_min) acc[0] = _mm256_add_ps(acc[0], acc2[0]), acc[1] = _mm256_add_ps(acc[1], acc2[1]);
      store_sum256(y + m * ldy + n, acc[0], acc[1], accumulate);
    }
  }
}

// Eight BF16 or F16 weights as floats; count < 8 reads only the first count (the rest are zeros).
// F16C converts halves: every AVX2 CPU has it, though the level's flags do not name it.
template <TensorType type> [[gnu::target("f16c")]] __m256 weights256(const std::byte* p, std::size_t count) {
  __m128i h;
  if (count >= 8) {
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  } else {
    std::uint16_t lanes[8] = {};
    std::memcpy(lanes, p, 2 * count);
    h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lanes));
  }
  if constexpr (type == TensorType::BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  else return _mm256_cvtph_ps(h);
}

inline __m256 load_x256(const float* x, std::size_t count) {
  return count >= 8 ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, detail::lanes_below<float>(count));
}

template <TensorType type>
[[gnu::target("f16c")]] void float_rows_avx2(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                     std::size_t last, bool accumulate) {
  for (std::size_t n = first; n < last; ++n)
    for (std::size_t m = 0; m < x.rows; ++m) {
      const float* xm = x.x + m * x.cols;
      const std::byte* row = w.row(n);
      __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
      for (std::size_t k = 0; k < w.cols; k += 16) {
        const std::size_t rest = w.cols - k;
        lo = _mm256_add_ps(lo, _mm256_mul_ps(weights256<type>(row + 2 * k, rest), load_x256(xm + k, rest)));
        if (rest > 8)
          hi = _mm256_add_ps(hi, _mm256_mul_ps(weights256<type>(row + 2 * k + 16, rest - 8), load_x256(xm + k + 8, rest - 8)));
      }
      store_sum256(y + m * ldy + n, lo, hi, accumulate);
    }
}

#endif

#if defined(__AVX512F__)

// ---- AVX-512 with VNNI: two blocks per vpdpbusd --------------------------------------------------

// Two halves, a's 8 times then b's 8 times, as 16 floats.
inline __m512 halves512(const std::byte* a, const std::byte* b) {
  return _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16(short(load_u16(b))), _mm_set1_epi16(short(load_u16(a)))));
}

// The sixteen group sums of blocks a and b (b null: a's alone, zeros in lanes 8-15).
template <TensorType type>
[[gnu::target("avx512vnni")]] __m512i group_sums512(const std::byte* a, const std::byte* b, const std::int8_t* q,
                                                    const std::int32_t* neg_sums) {
  using B = Blocks<type>;
  const __m512i xq = _mm512_loadu_si512(q);
  __m512i bias = _mm512_setzero_si512(), u;
  if constexpr (B::offset != 0) bias = _mm512_slli_epi32(_mm512_loadu_si512(neg_sums), B::shift);
  if constexpr (!B::nibbles) {
    const __m256i ua = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + B::codes));
    const __m256i ub = b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + B::codes)) : _mm256_set1_epi8(char(0x80));
    u = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(ua), ub, 1), _mm512_set1_epi8(char(0x80)));
  } else {
    const __m128i pa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + B::codes));
    const __m128i pb = b ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + B::codes)) : _mm_setzero_si128();
    const __m256i packed = _mm256_set_m128i(pb, pa), low = _mm256_set1_epi8(0xF);
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(packed, low)),
                                         _mm256_and_si256(_mm256_srli_epi16(packed, 4), low), 1);
    u = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));  // a low, a high, b low, b high
  }
  return _mm512_dpbusd_epi32(bias, u, xq);
}

template <TensorType type>
[[gnu::target("avx512vnni")]] void block_rows_vnni(float* y, std::size_t ldy, const ActivationRows& x,
                                                   const PackedMatrix& w, std::size_t first, std::size_t last,
                                                   bool accumulate) {
  using B = Blocks<type>;
  const std::size_t blocks = w.cols / 32;
  static constexpr std::byte zero_block[B::bytes] = {};  // the missing half of an odd last pair: d = m = 0
  for (std::size_t n = first; n < last; ++n) {
    const std::byte* row = w.row(n);
    for (std::size_t m = 0; m < x.rows; ++m) {
      const std::int8_t* q = x.q + m * x.blocks * 32;
      const std::int32_t* neg_sums = x.neg_sums + m * x.blocks * 8;
      const float* d = x.d + m * x.blocks * 8;
      const float* scaled_sums = x.scaled_sums + m * x.blocks * 8;
      __m512 acc = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
      for (std::size_t b = 0; b < blocks; b += 2) {
        const std::byte* a = row + b * B::bytes;
        const std::byte* next = b + 1 < blocks ? a + B::bytes : nullptr;
        const __m512i sums = group_sums512<type>(a, next, q + 32 * b, neg_sums + 8 * b);
        const __m512 scale = _mm512_mul_ps(halves512(a, next ? next : zero_block), _mm512_loadu_ps(d + 8 * b));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(sums), scale));
        if constexpr (B::has_min)
          acc2 = _mm512_add_ps(acc2, _mm512_mul_ps(halves512(a + 2, (next ? next : zero_block) + 2),
                                                   _mm512_loadu_ps(scaled_sums + 8 * b)));
      }
      if constexpr (B::has_min) acc = _mm512_add_ps(acc, acc2);
      store_sum256(y + m * ldy + n, _mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1), accumulate);
    }
  }
}

template <TensorType type> __m512 weights512(const std::byte* p, std::size_t count) {
  const __m256i h = count >= 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                : _mm256_maskz_loadu_epi16(__mmask16((1u << count) - 1), p);
  if constexpr (type == TensorType::BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  else return _mm512_cvtph_ps(h);
}

template <TensorType type>
void float_rows_avx512(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                       std::size_t last, bool accumulate) {
  for (std::size_t n = first; n < last; ++n)
    for (std::size_t m = 0; m < x.rows; ++m) {
      const float* xm = x.x + m * x.cols;
      const std::byte* row = w.row(n);
      __m512 acc = _mm512_setzero_ps();
      for (std::size_t k = 0; k < w.cols; k += 16) {
        const std::size_t rest = w.cols - k;
        const __m512 xs = rest >= 16 ? _mm512_loadu_ps(xm + k) : _mm512_maskz_loadu_ps(detail::lanes_below(rest), xm + k);
        acc = _mm512_add_ps(acc, _mm512_mul_ps(weights512<type>(row + 2 * k, rest), xs));
      }
      store_sum256(y + m * ldy + n, _mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1), accumulate);
    }
}

#endif

quant::PackedKernelTable make_table() {
#if defined(__AVX512F__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni"))
    return {block_rows_vnni<TensorType::Q4_0>, block_rows_vnni<TensorType::Q4_1>, block_rows_vnni<TensorType::Q8_0>,
            float_rows_avx512<TensorType::BF16>, float_rows_avx512<TensorType::F16>, "avx512vnni"};
#endif
#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
  return {block_rows_avx2<TensorType::Q4_0>, block_rows_avx2<TensorType::Q4_1>, block_rows_avx2<TensorType::Q8_0>,
#if defined(__AVX512F__)
          float_rows_avx512<TensorType::BF16>, float_rows_avx512<TensorType::F16>,
#else
          float_rows_avx2<TensorType::BF16>, float_rows_avx2<TensorType::F16>,
#endif
          "avx2 vpmaddubsw"};
#else
  return {block_rows_portable<TensorType::Q4_0>, block_rows_portable<TensorType::Q4_1>,
          block_rows_portable<TensorType::Q8_0>, float_rows_portable<TensorType::BF16>,
          float_rows_portable<TensorType::F16>, "portable"};
#endif
}

}  // namespace

const quant::PackedKernelTable& packed_table() {
  static const quant::PackedKernelTable table = make_table();
  return table;
}

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
