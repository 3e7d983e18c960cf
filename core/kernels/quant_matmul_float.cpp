// This level's packed kernels for BF16, F16 and F32 weights (core/quant/packed_kernels.h): float
// products, the weights widened exactly, each output's operations as Note [Packed products] fixes
// them, in register tiles of weight rows by activation rows (portable loops at SSE2 and emulated16).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/aligned.h"
#include "core/kernels/gemm_tiles.h"
#include "core/kernels/quant_matmul_tiles.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

namespace {

using quant::ActivationRows;
using quant::PackedMatrix;
using quant::TensorType;

// The bytes of one weight.
template <TensorType type> constexpr std::size_t weight_bytes = type == TensorType::F32 ? 4 : 2;

template <TensorType type> float weight_at(const std::byte* row, std::size_t k) {
  if constexpr (type == TensorType::F32) return std::bit_cast<float>(load_u32(row + 4 * k));
  const std::uint16_t bits = load_u16(row + 2 * k);
  if constexpr (type == TensorType::BF16) return std::bit_cast<float>(std::uint32_t(bits) << 16);
  else return half_to_float(bits);
}

// The lane element k accumulates in (Note [Packed products]).
template <TensorType type> constexpr std::size_t lane_of(std::size_t k) {
  return type == TensorType::BF16 ? k % 32 / 2 : k % 16;
}

template <TensorType type>
void float_rows_portable(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w,
                         std::size_t first, std::size_t last, bool accumulate) {
  for (std::size_t n = first; n < last; ++n)
    for (std::size_t m = 0; m < x.rows; ++m) {
      const float* xm = x.x + m * x.cols;
      float acc[16] = {};
      for (std::size_t k = 0; k < w.cols; ++k)
        acc[lane_of<type>(k)] = std::fma(weight_at<type>(w.row(n), k), xm[k], acc[lane_of<type>(k)]);
      store_sum(y + m * ldy + n, acc, accumulate);
    }
}

#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)

// The SIMD kernels walk 32 elements a step, which give each of the 16 lanes two terms in turn:
// `first` and `second`, whose x is lane_x's row at k and at k + 16. F16's and F32's are elements
// k .. k + 15 and k + 16 .. k + 31; BF16's the even and the odd elements, the low and high halves
// of each 32-bit word of weights.
template <TensorType type> const float* lane_x(const ActivationRows& x, std::size_t m) {
  return type == TensorType::BF16 ? x.pairs + m * x.pairs_cols : x.x + m * x.cols;
}

// x[0:lanes] in the first lanes of a vector, zeros in the rest (x[lanes:] never read).
inline Batch<float> load_lanes(const float* x, std::size_t lanes) {
  return lanes >= Batch<float>::size ? Batch<float>::load_unaligned(x) : detail::load_partial<Batch<float>>(x, lanes);
}

// How many lanes have a first and a second term when `rest` elements are left.
struct StepLanes {
  std::size_t first, second;
};
template <TensorType type> StepLanes step_lanes(std::size_t rest) {
  if (rest >= 32) return {16, 16};
  if constexpr (type == TensorType::BF16) return {(rest + 1) / 2, rest / 2};
  else return {std::min<std::size_t>(rest, 16), rest > 16 ? rest - 16 : 0};
}

#endif

#if defined(__AVX512F__)

// A step's weights from p as floats, exactly, zeros past rest: F16's and F32's halves (half 0 the
// first terms, 1 the second); BF16's 32-bit words, whose low halves shifted up are the first terms
// and whose high halves the second.
template <TensorType type, int half> __m512 halves512(const std::byte* p, std::size_t rest) {
  const StepLanes lanes = step_lanes<type>(rest);
  const std::size_t count = half == 0 ? lanes.first : lanes.second;
  const std::byte* q = p + 16 * weight_bytes<type> * half;
  if constexpr (type == TensorType::F32)
    return count >= 16 ? _mm512_loadu_ps(q) : _mm512_maskz_loadu_ps(detail::lanes_below(count), q);
  return _mm512_cvtph_ps(count >= 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))
                                     : _mm256_maskz_loadu_epi16(detail::lanes_below(count), q));
}
inline __m512i words512(const std::byte* p, std::size_t rest) {
  return rest >= 32 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(__mmask32((1u << rest) - 1), p);
}
inline __m512 low_halves(__m512i words) { return _mm512_castsi512_ps(_mm512_slli_epi32(words, 16)); }
inline __m512 high_halves(__m512i words) {
  return _mm512_castsi512_ps(_mm512_and_si512(words, _mm512_set1_epi32(-65536)));
}

// acc + w x in the first `lanes` lanes; the others keep acc (no term: Note [Packed products]).
inline __m512 fma_lanes(__m512 w, __m512 x, __m512 acc, std::size_t lanes) {
  return lanes >= 16 ? _mm512_fmadd_ps(w, x, acc) : _mm512_mask3_fmadd_ps(w, x, acc, detail::lanes_below(lanes));
}

// One half of a step's terms, from weights[r] and x at k, in the first `lanes` lanes.
template <int NR, int MR>
[[gnu::always_inline]] inline void float_terms(__m512 (&acc)[NR][MR], const __m512 (&weights)[NR],
                                               const float* const (&xs)[MR], std::size_t k, std::size_t lanes) {
  for (int i = 0; i < MR; ++i) {
    const __m512 xv = load_lanes(xs[i] + k, lanes);
    for (int r = 0; r < NR; ++r) acc[r][i] = fma_lanes(weights[r], xv, acc[r][i], lanes);
  }
}

// One step of 32 elements from k (the last `rest` of them when fewer) for a tile's accumulators,
// a half of the terms at a time, a line (F32: two) of weights a row: it asks for the lines `ahead`
// bytes on, into L2 when the weights stream from memory (one row of x), into L1 when a panel holds
// them.
template <TensorType type, int NR, int MR>
[[gnu::always_inline]] inline void float_step_avx512(__m512 (&acc)[NR][MR], const std::byte* const (&rows)[NR],
                                                     const float* const (&xs)[MR], std::size_t k, std::size_t rest,
                                                     std::size_t ahead, bool streaming) {
  constexpr std::size_t step_bytes = 32 * weight_bytes<type>;
  for (int r = 0; r < NR; ++r)
    for (std::size_t at = 0; at < step_bytes; at += 64) {
      const char* line = reinterpret_cast<const char*>(rows[r] + step_bytes / 32 * k + ahead + at);
      streaming ? _mm_prefetch(line, _MM_HINT_T1) : _mm_prefetch(line, _MM_HINT_T0);
    }
  const StepLanes lanes = step_lanes<type>(rest);
  __m512 weights[NR];
  if constexpr (type == TensorType::BF16) {
    __m512i words[NR];
    for (int r = 0; r < NR; ++r) words[r] = words512(rows[r] + 2 * k, rest), weights[r] = low_halves(words[r]);
    float_terms(acc, weights, xs, k, lanes.first);
    for (int r = 0; r < NR; ++r) weights[r] = high_halves(words[r]);
    float_terms(acc, weights, xs, k + 16, lanes.second);
  } else {
    for (int r = 0; r < NR; ++r) weights[r] = halves512<type, 0>(rows[r] + step_bytes / 32 * k, rest);
    float_terms(acc, weights, xs, k, lanes.first);
    for (int r = 0; r < NR; ++r) weights[r] = halves512<type, 1>(rows[r] + step_bytes / 32 * k, rest);
    float_terms(acc, weights, xs, k + 16, lanes.second);
  }
}

// Outputs (m0 .. m0 + MR - 1, n0 .. n0 + NR - 1) of BF16, F16 or F32 weights: each weight vector
// widened once for the MR rows, each x vector loaded once for the NR rows, and `next` asked for
// lines_each lines a step (float_rows). The whole steps apart from the last partial one, so that
// the accumulators stay in registers.
template <TensorType type, int NR, int MR>
void float_tile(float* y, std::size_t ldy, const ActivationRows& x, std::size_t m0, const std::byte* row,
                std::size_t n0, bool accumulate, detail::LineStream& next, std::size_t lines_each) {
  const std::byte* rows[NR];
  const float* xs[MR];
  __m512 acc[NR][MR];
  for (int r = 0; r < NR; ++r) {
    rows[r] = row + r * weight_bytes<type> * x.cols;
    for (int i = 0; i < MR; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  for (int i = 0; i < MR; ++i) xs[i] = lane_x<type>(x, m0 + i);
  const std::size_t ahead = prefetch_distance<NR>(weight_bytes<type> * x.cols);  // bytes on (quant_matmul_tiles.h)
  const bool streaming = lines_each == 0;  // no panel to fetch: one row of x, or a call's last panel
  std::size_t k = 0;
  for (; k + 32 <= x.cols; k += 32) {
    next.fetch(lines_each);
    float_step_avx512<type>(acc, rows, xs, k, 32, ahead, streaming);
  }
  if (k < x.cols) float_step_avx512<type>(acc, rows, xs, k, x.cols - k, ahead, streaming);
  store_tile512(y, ldy, m0, n0, acc, accumulate);
}

// One row of x: two weight rows share its loads. Up to a decoding batch's rows (16), 4 weight rows
// by 4 rows of x (16 accumulators, beside 4 BF16 words and the 4 vectors widened from them; 3 x 8
// spilled): each weight vector widened as it is read, once for 4 rows (bench_packed, SmolLM2's
// shapes, one thread: M = 4 and 16 1.2-1.6x faster than 3 x 8, F16 as BF16). More rows (a
// prompt) take widened_rows.
constexpr int rows_alone = 2, weight_rows = 4, x_rows = 4;
constexpr std::size_t widened_min_rows = 17;

// 16 lanes' terms of outputs (m0 .. m0 + MR - 1, n0 .. n0 + NR - 1) from weight rows already
// widened to floats in the lanes' order (rows `stride` apart, zeros past cols): NR weight and MR x
// loads feed NR x MR FMAs, and no conversion is left in the loop.
template <int NR, int MR>
[[gnu::always_inline]] inline void widened_step(__m512 (&acc)[NR][MR], const float* w, std::size_t stride,
                                                const float* const (&xs)[MR], std::size_t k, std::size_t lanes) {
  __m512 weights[NR];
  for (int r = 0; r < NR; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(w + (r + NR) * stride + k), _MM_HINT_T0);  // the next tile's
    weights[r] = _mm512_load_ps(w + r * stride + k);
  }
  for (int i = 0; i < MR; ++i) {
    const __m512 xv = load_lanes(xs[i] + k, lanes);
    for (int r = 0; r < NR; ++r) acc[r][i] = fma_lanes(weights[r], xv, acc[r][i], lanes);
  }
}

template <TensorType type, int NR, int MR>
void widened_tile(float* y, std::size_t ldy, const ActivationRows& x, std::size_t m0, const float* w,
                  std::size_t stride, std::size_t n0, bool accumulate) {
  const float* xs[MR];
  __m512 acc[NR][MR];
  for (int i = 0; i < MR; ++i) xs[i] = lane_x<type>(x, m0 + i);
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) acc[r][i] = _mm512_setzero_ps();
  std::size_t k = 0;
  for (const std::size_t whole = x.cols / 32 * 32; k < whole; k += 16) widened_step(acc, w, stride, xs, k, 16);
  if (k < x.cols) {
    const StepLanes lanes = step_lanes<type>(x.cols - k);
    widened_step(acc, w, stride, xs, k, lanes.first);
    if (lanes.second > 0) widened_step(acc, w, stride, xs, k + 16, lanes.second);
  }
  store_tile512(y, ldy, m0, n0, acc, accumulate);
}

// Many rows of x: the weights widened once a call into float panels (in L2), then 4 x 6 tiles of
// floats, with no conversion in the loop and x held in registers (the batched tiles load each x
// vector once a weight row). SmolLM2's BF16 prompts of 128 and 512 tokens prefilled 1.2x faster (one
// thread, AVX-512); at 4 and 16 rows, with the weights coming from memory, the separate widening
// pass was slower (S = 4 and 16 decoding 0.7x and 0.95x). The same bits either way (Note [Packed
// products]). F32's panels are copies on cache lines: a file's tensors may start 32 bytes into one,
// and every load across two lines costs about two.
template <TensorType type>
void widened_rows(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                  std::size_t last, bool accumulate) {
  // A panel's rows (quant::panel_bytes of 16-bit weights), widened: twice its bytes, still in L2.
  const std::size_t stride = (x.cols + 31) / 32 * 32, group = quant::panel_rows(2 * x.cols);
  thread_local AlignedVector<float> panel;
  if (panel.size() < group * stride) panel.resize(group * stride);
  for (std::size_t n0 = first; n0 < last; n0 += group) {
    const std::size_t n1 = std::min(last, n0 + group);
    float* widened = panel.data();
    for (std::size_t n = n0; n < n1; ++n) {
      const std::byte* row = w.row(n);
      for (std::size_t k = 0; k < x.cols; k += 32) {
        float* out = widened + (n - n0) * stride + k;
        if constexpr (type == TensorType::BF16) {
          const __m512i words = words512(row + 2 * k, x.cols - k);
          _mm512_store_ps(out, low_halves(words)), _mm512_store_ps(out + 16, high_halves(words));
        } else {
          _mm512_store_ps(out, halves512<type, 0>(row + weight_bytes<type> * k, x.cols - k));
          _mm512_store_ps(out + 16, halves512<type, 1>(row + weight_bytes<type> * k, x.cols - k));
        }
      }
    }
    auto tile = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
      widened_tile<type, NR, MR>(y, ldy, x, m0, widened + (n - n0) * stride, stride, n, accumulate);
    };
    run_tiles<4, 6>(tile, x.rows, 0, n0, n1);
  }
}

#elif defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)

// Eight lanes of a step's weights from p (32 whole elements) as floats, exactly: quarter 0 the
// first terms of lanes 0-7, 1 those of lanes 8-15, 2 and 3 the second terms of the same lanes.
// F16C converts halves: every AVX2 CPU has it, though the level's flags do not name it.
template <TensorType type, int quarter> [[gnu::target("f16c")]] __m256 weights256(const std::byte* p) {
  if constexpr (type == TensorType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p + 32 * quarter));
  } else if constexpr (type == TensorType::BF16) {
    const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * (quarter % 2)));
    return _mm256_castsi256_ps(quarter < 2 ? _mm256_slli_epi32(words, 16)
                                           : _mm256_and_si256(words, _mm256_set1_epi32(-65536)));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * quarter)));
  }
}

// acc + w x in the first `lanes` lanes; the others keep acc (no term: Note [Packed products]).
inline __m256 fma_lanes(__m256 w, __m256 x, __m256 acc, std::size_t lanes) {
  if (lanes >= 8) return _mm256_fmadd_ps(w, x, acc);
  return _mm256_blendv_ps(acc, _mm256_fmadd_ps(w, x, acc), _mm256_castsi256_ps(detail::lanes_below<float>(lanes)));
}


// One quarter's terms (weights256) from the weights at at[r] into acc's lanes 0-7 (quarters 0 and
// 2) or 8-15 (1 and 3), in the first `lanes` of them.
template <TensorType type, int quarter, int NR, int MR>
[[gnu::always_inline, gnu::target("f16c")]] inline void float_terms(__m256 (&acc)[NR][MR][2],
                                                                    const std::byte* const (&at)[NR],
                                                                    const float* const (&xs)[MR], std::size_t k,
                                                                    std::size_t lanes) {
  if (lanes == 0) return;
  __m256 weights[NR];
  for (int r = 0; r < NR; ++r) weights[r] = weights256<type, quarter>(at[r]);
  for (int i = 0; i < MR; ++i) {
    const __m256 xv = load_lanes(xs[i] + k + 8 * (quarter % 2) + 16 * (quarter / 2), lanes);
    for (int r = 0; r < NR; ++r) acc[r][i][quarter % 2] = fma_lanes(weights[r], xv, acc[r][i][quarter % 2], lanes);
  }
}

// One step of 32 elements from k, the weights at at[r], `lanes` of each half present.
template <TensorType type, int NR, int MR>
[[gnu::always_inline, gnu::target("f16c")]] inline void float_step_avx2(__m256 (&acc)[NR][MR][2],
                                                                        const std::byte* const (&at)[NR],
                                                                        const float* const (&xs)[MR], std::size_t k,
                                                                        StepLanes lanes) {
  auto low = [](std::size_t n) { return std::min<std::size_t>(n, 8); };
  auto high = [](std::size_t n) { return n > 8 ? n - 8 : 0; };
  float_terms<type, 0>(acc, at, xs, k, low(lanes.first));
  float_terms<type, 1>(acc, at, xs, k, high(lanes.first));
  float_terms<type, 2>(acc, at, xs, k, low(lanes.second));
  float_terms<type, 3>(acc, at, xs, k, high(lanes.second));
}

// Outputs (m0 .. m0 + MR - 1, n0 .. n0 + NR - 1) of BF16, F16 or F32 weights: each weight vector
// widened once for the MR rows, each x vector loaded once for the NR rows; the last partial step's
// weights copied first into zeros.
template <TensorType type, int NR, int MR>
[[gnu::target("f16c")]] void float_tile(float* y, std::size_t ldy, const ActivationRows& x, std::size_t m0,
                                        const std::byte* row, std::size_t n0, bool accumulate,
                                        detail::LineStream& next, std::size_t lines_each) {
  const std::byte* rows[NR];
  const float* xs[MR];
  __m256 acc[NR][MR][2];
  for (int r = 0; r < NR; ++r) {
    rows[r] = row + r * weight_bytes<type> * x.cols;
    for (int i = 0; i < MR; ++i) acc[r][i][0] = acc[r][i][1] = _mm256_setzero_ps();
  }
  for (int i = 0; i < MR; ++i) xs[i] = lane_x<type>(x, m0 + i);
  std::size_t k = 0;
  for (; k + 32 <= x.cols; k += 32) {
    next.fetch(lines_each);
    const std::byte* at[NR];
    for (int r = 0; r < NR; ++r) at[r] = rows[r] + weight_bytes<type> * k;
    float_step_avx2<type>(acc, at, xs, k, {16, 16});
  }
  if (k < x.cols) {
    alignas(32) std::byte tail[NR][32 * weight_bytes<type>] = {};
    const std::byte* at[NR];
    for (int r = 0; r < NR; ++r)
      at[r] = static_cast<const std::byte*>(
          std::memcpy(tail[r], rows[r] + weight_bytes<type> * k, weight_bytes<type> * (x.cols - k)));
    float_step_avx2<type>(acc, at, xs, k, step_lanes<type>(x.cols - k));
  }
  store_tile256(y, ldy, m0, n0, acc, accumulate);
}

// 16 registers hold 2 x 2 outputs' 16 lanes (8 accumulators), their weights and x.
constexpr int rows_alone = 2, weight_rows = 2, x_rows = 2;

#endif

#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
// The outputs in the level's register tiles: one x row with rows_alone weight rows, streaming;
// a few rows (batched decoding) in weight_rows by x_rows tiles over panels of weight rows that
// stay in L2 while every tile of x passes, the next panel fetched into L2 a line or so a step
// meanwhile (SmolLM2 BF16 at AVX-512, one thread: S = 4 and 16 decoding 1.07x and 1.11x the
// panels without); many rows at AVX-512 widened_rows. At AVX-512 F32's weights, twice BF16's
// bytes, stream instead: each tile of weight rows meets every row of x while in L1, and is read
// from memory once, as one row's are (whole runs of `generate` decoding 16 sequences of SmolLM2's
// F32 file: 1.06x as fast as through panels on one thread, 1.15x on two; BF16's, bound by widening
// its words, 0.96x). AVX2's tiles of 2 weight rows would read all of x from L2 for every 2 rows:
// 0.87x there.
template <TensorType type>
void float_rows(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                std::size_t last, bool accumulate) {
  const std::size_t row_bytes = weight_bytes<type> * x.cols;
  detail::LineStream none;
  auto streamed = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
    float_tile<type, NR, MR>(y, ldy, x, m0, w.bytes.data() + n * row_bytes, n, accumulate, none, 0);
  };
  if (x.rows == 1) return run_tiles<rows_alone, 1>(streamed, x.rows, 0, first, last);
#if defined(__AVX512F__)
  if (x.rows >= widened_min_rows) return widened_rows<type>(y, ldy, x, w, first, last, accumulate);
  if constexpr (type == TensorType::F32) {
    for (std::size_t n = first; n < last; n += weight_rows)
      run_tiles<weight_rows, x_rows>(streamed, x.rows, 0, n, std::min(last, n + weight_rows));
    return;
  }
#endif
  const std::size_t panel = quant::panel_rows(row_bytes);
  for (std::size_t n0 = first; n0 < last; n0 += panel) {
    const std::size_t n1 = std::min(last, n0 + panel), next = std::min(last, n1 + panel) - n1;
    detail::LineStream ahead(w.bytes.data() + n1 * row_bytes, row_bytes, row_bytes, next);
    const std::size_t tiles = (x.rows + x_rows - 1) / x_rows * ((n1 - n0 + weight_rows - 1) / weight_rows);
    const std::size_t steps = std::max<std::size_t>(1, tiles * (x.cols / 32));
    const std::size_t lines_each = (ahead.lines_left() + steps - 1) / steps;
    auto tile = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
      float_tile<type, NR, MR>(y, ldy, x, m0, w.bytes.data() + n * row_bytes, n, accumulate, ahead, lines_each);
    };
    run_tiles<weight_rows, x_rows>(tile, x.rows, 0, n0, n1);
  }
}
#endif

}  // namespace

void set_float_kernels(quant::PackedKernelTable& table) {
#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
  table.bf16 = float_rows<TensorType::BF16>, table.f16 = float_rows<TensorType::F16>;
  table.f32 = float_rows<TensorType::F32>;
#else
  table.bf16 = float_rows_portable<TensorType::BF16>, table.f16 = float_rows_portable<TensorType::F16>;
  table.f32 = float_rows_portable<TensorType::F32>;
#endif
}

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
