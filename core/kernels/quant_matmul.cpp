// This level's packed kernels for the integer formats, the blocks of 32 (Q4_0, Q4_1, Q5_0, Q8_0) and
// the K-quants (Q4_K, Q6_K; core/quant/packed_kernels.h): integer dot products of sixteen outputs'
// codes, a SIMD lane each (core/quant/row_groups.h), with x's 8-bit blocks broadcast, each output
// computed as Note [Packed products] fixes it, in tiles of one group by MR rows of x; and the
// level's tables. Plain loops at SSE2 and emulated16; AVX2 forms the integer sums with AVX-VNNI or
// vpmaddubsw, eight lanes at a time; AVX-512 with VNNI sixteen.
#include <cpuid.h>

#include <cmath>
#include <vector>

#include "core/kernels/matmul_bf16.h"
#include "core/kernels/quant_matmul_tiles.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

namespace {

using quant::ActivationRows;
using quant::PackedMatrix;
using quant::TensorType;
using quant::UnitLayout;

// What the kernels need of a format beside its unit's layout: blocks of 32 a unit, integer sums a
// block (Q6_K's halves have their own scales), whether a minimum term follows, and the offset as a
// shift (offset = 1 << shift, or no offset).
template <TensorType type> struct Format {
  static constexpr UnitLayout layout = quant::unit_layout(type);
  static constexpr bool k_quant = type == TensorType::Q4_K || type == TensorType::Q6_K;
  static constexpr std::size_t blocks = k_quant ? 8 : 1;
  static constexpr int segments = type == TensorType::Q6_K ? 2 : 1;
  static constexpr bool has_min = type == TensorType::Q4_1 || type == TensorType::Q4_K;
  static constexpr bool nibbles = type != TensorType::Q8_0;
  static constexpr int shift = std::countr_zero(unsigned(layout.offset));
};

// x's bias for segment h of block `at` (an index into x's blocks): offset times minus the sum of
// its q, so that the unsigned codes' sum becomes q_w . q.
template <TensorType type> std::int32_t bias_of(const ActivationRows& x, std::size_t at, int h) {
  using F = Format<type>;
  if constexpr (F::layout.offset == 0) {
    return 0;
  } else {
    const std::int32_t neg = F::segments == 2 ? x.neg_half_sums[2 * at + h] : x.neg_sums[at];
    return std::int32_t(std::uint32_t(neg) << F::shift);
  }
}

// ---- portable: the definition, in plain loops --------------------------------------------------

// Row r's code k (0..31) of block s of a unit.
template <TensorType type> unsigned code_of(const std::byte* unit, std::size_t s, std::size_t r, std::size_t k) {
  using F = Format<type>;
  const std::byte* chunks = unit + F::layout.codes + s * F::layout.sub_bytes;
  const std::size_t t = k % 4;
  if constexpr (!F::nibbles) return unsigned(chunks[64 * (k / 4) + 4 * r + t]);
  const unsigned byte = unsigned(chunks[64 * (k % 16 / 4) + 4 * r + t]);
  unsigned u = k < 16 ? byte & 0xF : byte >> 4;
  if constexpr (type == TensorType::Q5_0) u |= ((unsigned(unit[F::layout.fifth + 4 * r + t]) >> (k / 4)) & 1) << 4;
  if constexpr (type == TensorType::Q6_K) u |= ((unsigned(chunks[256 + 64 * (k / 16) + 4 * r + t]) >> (2 * (k / 4 % 4))) & 3) << 4;
  return u;
}

// d_w of segment h of block s for row r, and m_w (Note [Packed products]).
template <TensorType type> float scale_of(const std::byte* unit, std::size_t s, int h, std::size_t r) {
  using F = Format<type>;
  const float d = half_to_float(load_u16(unit + F::layout.d + 2 * r));
  if constexpr (type == TensorType::Q4_K) return d * float(unsigned(unit[F::layout.scales + 16 * s + r]));
  if constexpr (type == TensorType::Q6_K) return d * float(std::int8_t(unit[F::layout.scales + 16 * (2 * s + h) + r]));
  return d;
}
template <TensorType type> float min_of(const std::byte* unit, std::size_t s, std::size_t r) {
  using F = Format<type>;
  const float m = half_to_float(load_u16(unit + F::layout.m + 2 * r));
  if constexpr (type == TensorType::Q4_K) return -(m * float(unsigned(unit[F::layout.scales + 16 * (8 + s) + r])));
  return m;
}

template <TensorType type>
void integer_rows_portable(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w,
                           std::size_t first, std::size_t last, bool accumulate) {
  using F = Format<type>;
  constexpr std::size_t per_segment = 32 / F::segments;
  for (std::size_t n = first; n < last; ++n) {
    const std::byte* group = w.group(n / group_rows);
    const std::size_t r = n % group_rows;
    for (std::size_t m = 0; m < x.rows; ++m) {
      float acc = 0;
      for (std::size_t u = 0; u < w.units(); ++u) {
        const std::byte* unit = group + u * F::layout.bytes;
        for (std::size_t s = 0; s < F::blocks; ++s) {
          const std::size_t at = m * x.blocks + u * F::blocks + s;
          for (int h = 0; h < F::segments; ++h) {
            std::int32_t sum = bias_of<type>(x, at, h);
            for (std::size_t k = h * per_segment; k < (h + 1) * per_segment; ++k)
              sum += std::int32_t(code_of<type>(unit, s, r, k)) * x.q[32 * at + k];
            acc = std::fma(float(sum), scale_of<type>(unit, s, h, r) * x.d[at], acc);
          }
          if constexpr (F::has_min) acc = std::fma(min_of<type>(unit, s, r), x.scaled_sums[at], acc);
        }
      }
      y[m * ldy + n] = accumulate ? y[m * ldy + n] + acc : acc;
    }
  }
}

#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)

// ---- SIMD: a tile of one group's lanes by MR rows of x, for AVX2 (eight lanes, the group in two
// halves) and AVX-512 (sixteen), through the operations below ------------------------------------

// AVX2's lanes: half h of a group reads the second 32 bytes of each chunk, the second 8 halves and
// scale bytes. Integer sums by AVX-VNNI's vpdpbusd (vnni) or by vpmaddubsw and vpmaddwd, whose
// pairs stay below 2^15: Q4's and Q6_K's codes are below 64, and Q8_0's are taken signed with
// their sign moved onto x (the sum is then q_w . q itself, with no offset to take back).
template <bool vnni> struct Lanes256 {
  static constexpr std::size_t lanes = 8;
  static constexpr bool signed_q8 = !vnni;
  using I = __m256i;
  using F = __m256;
  static I chunk(const std::byte* p, std::size_t half) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * half)); }
  static I set1(std::int32_t v) { return _mm256_set1_epi32(v); }
  static I broadcast(const std::int8_t* q) { return _mm256_set1_epi32(int(load_u32(reinterpret_cast<const std::byte*>(q)))); }
  static I and_(I a, std::int32_t mask) { return _mm256_and_si256(a, _mm256_set1_epi32(mask)); }
  static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  static I shift_left(I a, int n) { return _mm256_slli_epi32(a, n); }
  static I shift_right(I a, int n) { return _mm256_srli_epi32(a, n); }
  [[gnu::target("avxvnni")]] static I dot(I sum, I u, I q) {
    if constexpr (vnni) return _mm256_dpbusd_avx_epi32(sum, u, q);
    else return _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1)));
  }
  static I dot_signed(I sum, I w, I q) {  // w signed bytes
    return _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(q, w)),
                                                   _mm256_set1_epi16(1)));
  }
  static I flip(I u) { return _mm256_xor_si256(u, _mm256_set1_epi8(char(0x80))); }
  static F halves(const std::byte* p, std::size_t half) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * half)));
  }
  static F unsigned_bytes(const std::byte* p, std::size_t half) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * half))));
  }
  static F signed_bytes(const std::byte* p, std::size_t half) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * half))));
  }
  static F zero() { return _mm256_setzero_ps(); }
  static F set1f(float v) { return _mm256_set1_ps(v); }
  static F to_float(I a) { return _mm256_cvtepi32_ps(a); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F neg(F a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, F a) { _mm256_storeu_ps(p, a); }
};

#if defined(__AVX512F__)
struct Lanes512 {
  static constexpr std::size_t lanes = 16;
  static constexpr bool signed_q8 = false;
  using I = __m512i;
  using F = __m512;
  static I chunk(const std::byte* p, std::size_t) { return _mm512_loadu_si512(p); }
  static I set1(std::int32_t v) { return _mm512_set1_epi32(v); }
  static I broadcast(const std::int8_t* q) { return _mm512_set1_epi32(int(load_u32(reinterpret_cast<const std::byte*>(q)))); }
  static I and_(I a, std::int32_t mask) { return _mm512_and_si512(a, _mm512_set1_epi32(mask)); }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  static I shift_left(I a, int n) { return _mm512_slli_epi32(a, unsigned(n)); }
  static I shift_right(I a, int n) { return _mm512_srli_epi32(a, unsigned(n)); }
  [[gnu::target("avx512vnni")]] static I dot(I sum, I u, I q) { return _mm512_dpbusd_epi32(sum, u, q); }
  static I dot_signed(I sum, I, I) { return sum; }  // not used: VNNI takes Q8_0's codes unsigned
  static I flip(I u) { return u; }
  static F halves(const std::byte* p, std::size_t) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F unsigned_bytes(const std::byte* p, std::size_t) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static F signed_bytes(const std::byte* p, std::size_t) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static F zero() { return _mm512_setzero_ps(); }
  static F set1f(float v) { return _mm512_set1_ps(v); }
  static F to_float(I a) { return _mm512_cvtepi32_ps(a); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F neg(F a) { return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(int(0x80000000u)))); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, F a) { _mm512_storeu_ps(p, a); }
};
#endif

// The tiles are compiled for every integer dot the level's tables may use (each table's kernels
// call only their own instructions).
#if defined(__AVX512F__)
#define TAPEGRAD_INTEGER_TARGETS "avxvnni,avx512vnni"
#else
#define TAPEGRAD_INTEGER_TARGETS "avxvnni"
#endif

// Chunk j of block s's codes (codes 4j .. 4j + 3 of each lane), unsigned.
template <TensorType type, class V>
[[gnu::target(TAPEGRAD_INTEGER_TARGETS)]] inline typename V::I codes(const std::byte* unit, std::size_t s, int j, std::size_t half) {
  using F = Format<type>;
  const std::byte* chunks = unit + F::layout.codes + s * F::layout.sub_bytes;
  if constexpr (!F::nibbles) return V::chunk(chunks + 64 * j, half);
  const typename V::I packed = V::chunk(chunks + 64 * (j % 4), half);
  typename V::I u = j < 4 ? V::and_(packed, 0x0F0F0F0F) : V::and_(V::shift_right(packed, 4), 0x0F0F0F0F);
  if constexpr (type == TensorType::Q5_0) {  // bit j of each byte, to 0x10
    const typename V::I bits = V::chunk(unit + F::layout.fifth, half);
    u = V::or_(u, V::and_(j <= 4 ? V::shift_left(bits, 4 - j) : V::shift_right(bits, j - 4), 0x10101010));
  }
  if constexpr (type == TensorType::Q6_K) {  // bits 2c, 2c + 1 of chunk j / 4, to 0x30
    const typename V::I bits = V::chunk(chunks + 256 + 64 * (j / 4), half);
    const int c = j % 4;
    u = V::or_(u, V::and_(c <= 2 ? V::shift_left(bits, 4 - 2 * c) : V::shift_right(bits, 2), 0x30303030));
  }
  return u;
}

// Outputs of group `group`'s lanes for x's rows m0 .. m0 + MR - 1, into out[i * 16 + lane]. When
// `ahead` is not zero, each unit asks for the same unit of the next group, `ahead` bytes on, into
// L2: the weights stream from memory while a group's tiles compute.
template <TensorType type, class V, int MR>
[[gnu::target(TAPEGRAD_INTEGER_TARGETS)]] void integer_tile(const std::byte* group, std::size_t units,
                                                            const ActivationRows& x, std::size_t m0, std::size_t half,
                                                            std::size_t ahead, float* out) {
  using F = Format<type>;
  using I = typename V::I;
  using Fl = typename V::F;
  constexpr bool signed_q8 = V::signed_q8 && type == TensorType::Q8_0;
  constexpr int per_segment = 8 / F::segments;
  Fl acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = V::zero();
  for (std::size_t u = 0; u < units; ++u) {
    const std::byte* unit = group + u * F::layout.bytes;
    if (ahead)
      for (std::size_t line = 0; line < F::layout.bytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(unit + ahead + line), _MM_HINT_T1);
    for (std::size_t s = 0; s < F::blocks; ++s) {
      const std::size_t b = u * F::blocks + s;
      const Fl d = V::halves(unit + F::layout.d, half);
      for (int h = 0; h < F::segments; ++h) {
        Fl d_w = d;
        if constexpr (type == TensorType::Q4_K) d_w = V::mul(d, V::unsigned_bytes(unit + F::layout.scales + 16 * s, half));
        if constexpr (type == TensorType::Q6_K)
          d_w = V::mul(d, V::signed_bytes(unit + F::layout.scales + 16 * (2 * s + h), half));
        I sums[MR];
        for (int i = 0; i < MR; ++i) sums[i] = V::set1(signed_q8 ? 0 : bias_of<type>(x, (m0 + i) * x.blocks + b, h));
        for (int j = h * per_segment; j < (h + 1) * per_segment; ++j) {
          const I u8 = codes<type, V>(unit, s, j, half);
          const I w8 = V::flip(u8);
          for (int i = 0; i < MR; ++i) {
            const I q = V::broadcast(x.q + 32 * ((m0 + i) * x.blocks + b) + 4 * j);
            sums[i] = signed_q8 ? V::dot_signed(sums[i], w8, q) : V::dot(sums[i], u8, q);
          }
        }
        for (int i = 0; i < MR; ++i)
          acc[i] = V::fma(V::to_float(sums[i]), V::mul(d_w, V::set1f(x.d[(m0 + i) * x.blocks + b])), acc[i]);
      }
      if constexpr (F::has_min) {
        Fl m_w = V::halves(unit + F::layout.m, half);
        if constexpr (type == TensorType::Q4_K)
          m_w = V::neg(V::mul(m_w, V::unsigned_bytes(unit + F::layout.scales + 16 * (8 + s), half)));
        for (int i = 0; i < MR; ++i) acc[i] = V::fma(m_w, V::set1f(x.scaled_sums[(m0 + i) * x.blocks + b]), acc[i]);
      }
    }
  }
  for (int i = 0; i < MR; ++i) V::store(out + 16 * i + V::lanes * half, acc[i]);
}

// The tiles' rows of x: AVX-512's 32 registers hold 8 rows' sums and accumulators, AVX2's 16 hold 4.
template <TensorType type, class V>
void integer_rows_simd(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                       std::size_t last, bool accumulate) {
  constexpr int MR = V::lanes == 16 ? 8 : 4;
  auto tile = [&]<int NG, int R>(std::size_t g, std::size_t m0) {
    alignas(64) float out[R * 16];
    // The first tile of rows asks for the next group.
    const std::size_t ahead = m0 == 0 && x.rows >= rows_to_prefetch && g + 1 < w.groups() ? w.group_bytes() : 0;
    for (std::size_t half = 0; half < 16 / V::lanes; ++half)
      integer_tile<type, V, R>(w.group(g), w.units(), x, m0, half, half == 0 ? ahead : 0, out);
    for (int i = 0; i < R; ++i)
      store_group(y + (m0 + i) * ldy + g * group_rows, out + 16 * i, g, first, last, accumulate);
  };
  run_groups<1, MR>(tile, x.rows, first, last);
}

#endif

// AVX-VNNI is CPUID leaf 7 subleaf 1, EAX bit 4, asked of CPUID itself: clang 14's
// __builtin_cpu_supports does not know the name "avxvnni".
[[maybe_unused]] bool cpu_has_avx_vnni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4)) != 0;
}

template <template <TensorType> class Kernel> void set_integer_kernels(quant::PackedKernelTable& table) {
  table.q4_0 = Kernel<TensorType::Q4_0>::run, table.q4_1 = Kernel<TensorType::Q4_1>::run;
  table.q5_0 = Kernel<TensorType::Q5_0>::run, table.q8_0 = Kernel<TensorType::Q8_0>::run;
  table.q4_k = Kernel<TensorType::Q4_K>::run, table.q6_k = Kernel<TensorType::Q6_K>::run;
}
template <TensorType type> struct Portable {
  static constexpr quant::PackedKernel run = integer_rows_portable<type>;
};
#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
template <TensorType type> struct Maddubs {
  static constexpr quant::PackedKernel run = integer_rows_simd<type, Lanes256<false>>;
};
template <TensorType type> struct AvxVnni {
  static constexpr quant::PackedKernel run = integer_rows_simd<type, Lanes256<true>>;
};
#endif
#if defined(__AVX512F__)
template <TensorType type> struct Avx512Vnni {
  static constexpr quant::PackedKernel run = integer_rows_simd<type, Lanes512>;
};
#endif

// One table: the integer formats' kernels that form integer sums as `dot` says, BF16's with
// VDPBF16PS or not, and the level's float kernels and activation quantizer.
quant::PackedKernelTable make_table(IntegerDot dot, const char* name, bool bf16_instruction) {
  quant::PackedKernelTable table;
  switch (dot) {
#if defined(__AVX512F__)
    case IntegerDot::avx512_vnni: set_integer_kernels<Avx512Vnni>(table); break;
#endif
#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
    case IntegerDot::avx_vnni: set_integer_kernels<AvxVnni>(table); break;
    case IntegerDot::avx2_maddubs: set_integer_kernels<Maddubs>(table); break;
#endif
    default: set_integer_kernels<Portable>(table); break;
  }
  set_float_kernels(table);
  set_bf16_kernels(table, bf16_instruction);
  table.quantize_row = activation_quantizer();
  table.integer_dot = name;
  return table;
}

// The first table takes VDPBF16PS for BF16 where the CPU has it and it outruns the FMA chain (not
// on every CPU: bf16_gemm's timing, matmul_bf16.cpp); the last takes the other way, so that the
// tests run both.
std::vector<quant::PackedKernelTable> make_tables() {
  std::vector<std::pair<IntegerDot, const char*>> dots;
  bool has_instruction = false, faster = false;
#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
  __builtin_cpu_init();
#if defined(__AVX512F__)
  has_instruction = cpu_has_bf16_dot_products(), faster = has_instruction && instruction_outruns_chain();
  if (__builtin_cpu_supports("avx512vnni")) dots.emplace_back(IntegerDot::avx512_vnni, "avx512vnni");
#endif
  if (cpu_has_avx_vnni()) dots.emplace_back(IntegerDot::avx_vnni, "avxvnni");
  dots.emplace_back(IntegerDot::avx2_maddubs, "avx2 vpmaddubsw");
#else
  dots.emplace_back(IntegerDot::portable, "portable");
#endif
  std::vector<quant::PackedKernelTable> tables;
  for (std::size_t i = 0; i < dots.size(); ++i) {
    const bool instruction = i == 0 ? faster : i + 1 == dots.size() && has_instruction && !faster;
    tables.push_back(make_table(dots[i].first, dots[i].second, instruction));
  }
  return tables;
}

}  // namespace

std::span<const quant::PackedKernelTable> packed_tables() {
  static const std::vector<quant::PackedKernelTable> tables = make_tables();
  return tables;
}

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
