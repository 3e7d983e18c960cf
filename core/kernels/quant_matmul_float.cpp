// This level's packed kernels for BF16 and F16 weights (core/quant/packed_kernels.h): float
// products, the weights widened exactly, each output's operations as Note [Packed products] fixes
// them, in register tiles of weight rows by activation rows (portable loops at SSE2 and emulated16).
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
      for (std::size_t k = 0; k < w.cols; ++k) acc[k % 16] = std::fma(weight_at<type>(w.row(n), k), xm[k], acc[k % 16]);
      store_sum(y + m * ldy + n, acc, accumulate);
    }
}

#if defined(__AVX512F__)

template <TensorType type> __m512 weights512(const std::byte* p, std::size_t count) {
  const __m256i h = count >= 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                : _mm256_maskz_loadu_epi16(__mmask16((1u << count) - 1), p);
  if constexpr (type == TensorType::BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  else return _mm512_cvtph_ps(h);
}

// One step of 16 elements from k (the last `rest` of them when fewer) for a tile's accumulators;
// every other step (k % 32 == 0: a line of weights a row) asks for the line `ahead` bytes on, into
// L2 when the weights stream from memory (one row of x), into L1 when a panel already holds them.
template <TensorType type, int NR, int MR>
[[gnu::always_inline]] inline void float_step_avx512(__m512 (&acc)[NR][MR], const std::byte* const (&rows)[NR],
                                                     const float* const (&xs)[MR], std::size_t k, std::size_t rest,
                                                     std::size_t ahead, bool streaming) {
  __m512 weights[NR];
  for (int r = 0; r < NR; ++r) {
    const char* line = reinterpret_cast<const char*>(rows[r] + 2 * k + ahead);
    if (k % 32 == 0) streaming ? _mm_prefetch(line, _MM_HINT_T1) : _mm_prefetch(line, _MM_HINT_T0);
    weights[r] = weights512<type>(rows[r] + 2 * k, rest);
  }
  for (int i = 0; i < MR; ++i) {
    const __m512 xv = rest >= 16 ? _mm512_loadu_ps(xs[i] + k) : _mm512_maskz_loadu_ps(detail::lanes_below(rest), xs[i] + k);
    for (int r = 0; r < NR; ++r) acc[r][i] = _mm512_fmadd_ps(weights[r], xv, acc[r][i]);
  }
}

// A tile's outputs y(m0 + i, n0 + r), each the tree sum of acc[r][i]'s lanes (store_sum256).
template <int NR, int MR>
[[gnu::always_inline]] inline void store_tile(float* y, std::size_t ldy, std::size_t m0, std::size_t n0,
                                              const __m512 (&acc)[NR][MR], bool accumulate) {
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i)
      store_sum256(y + (m0 + i) * ldy + n0 + r, _mm512_castps512_ps256(acc[r][i]),
                   _mm512_extractf32x8_ps(acc[r][i], 1), accumulate);
}

// Outputs (m0 .. m0 + MR - 1, n0 .. n0 + NR - 1) of BF16 or F16 weights: each weight vector
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
    rows[r] = row + r * 2 * x.cols;
    for (int i = 0; i < MR; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  for (int i = 0; i < MR; ++i) xs[i] = x.x + (m0 + i) * x.cols;
  const std::size_t ahead = prefetch_distance<NR>(2 * x.cols);  // bytes on (quant_matmul_tiles.h)
  const bool streaming = lines_each == 0;  // no panel to fetch: one row of x, or a call's last panel
  std::size_t k = 0;
  for (; k + 16 <= x.cols; k += 16) {
    next.fetch(lines_each);
    float_step_avx512<type>(acc, rows, xs, k, 16, ahead, streaming);
  }
  if (k < x.cols) float_step_avx512<type>(acc, rows, xs, k, x.cols - k, ahead, streaming);
  store_tile(y, ldy, m0, n0, acc, accumulate);
}

// One row of x: two weight rows share its loads. Up to a decoding batch's rows (16), 3 weight rows
// by 8 rows of x (24 accumulators): each weight vector widened as it is read, once for 8 rows.
// More rows (a prompt) take widened_rows.
constexpr int rows_alone = 2, weight_rows = 3, x_rows = 8;
constexpr std::size_t widened_min_rows = 17;

// Outputs (m0 .. m0 + MR - 1, n0 .. n0 + NR - 1) from weight rows already widened to floats (rows
// `stride` apart, zeros past cols): per 16 elements NR weight and MR x loads feed NR x MR FMAs,
// and no conversion is left in the loop.
template <int NR, int MR>
[[gnu::always_inline]] inline void widened_step(__m512 (&acc)[NR][MR], const float* w, std::size_t stride,
                                                const float* const (&xs)[MR], std::size_t k, __mmask16 lanes) {
  __m512 weights[NR];
  for (int r = 0; r < NR; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(w + (r + NR) * stride + k), _MM_HINT_T0);  // the next tile's
    weights[r] = _mm512_load_ps(w + r * stride + k);
  }
  for (int i = 0; i < MR; ++i) {
    const __m512 xv = lanes == 0xFFFF ? _mm512_loadu_ps(xs[i] + k) : _mm512_maskz_loadu_ps(lanes, xs[i] + k);
    for (int r = 0; r < NR; ++r) acc[r][i] = _mm512_fmadd_ps(weights[r], xv, acc[r][i]);
  }
}

template <int NR, int MR>
void widened_tile(float* y, std::size_t ldy, const ActivationRows& x, std::size_t m0, const float* w,
                  std::size_t stride, std::size_t n0, bool accumulate) {
  const float* xs[MR];
  __m512 acc[NR][MR];
  for (int i = 0; i < MR; ++i) xs[i] = x.x + (m0 + i) * x.cols;
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) acc[r][i] = _mm512_setzero_ps();
  std::size_t k = 0;
  for (; k + 16 <= x.cols; k += 16) widened_step(acc, w, stride, xs, k, 0xFFFF);
  if (k < x.cols) widened_step(acc, w, stride, xs, k, detail::lanes_below(x.cols - k));
  store_tile(y, ldy, m0, n0, acc, accumulate);
}

// Many rows of x: the weights widened once a call into float panels (in L2), then 4 x 6 tiles of
// floats, with no conversion in the loop and x held in registers (the 3 x 8 tile loads each x
// vector three times). SmolLM2's BF16 prompts of 128 and 512 tokens prefilled 1.2x faster (one
// thread, AVX-512); at 4 and 16 rows, with the weights coming from memory, the separate widening
// pass was slower (S = 4 and 16 decoding 0.7x and 0.95x). The same bits either way (Note [Packed
// products]).
template <TensorType type>
void widened_rows(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                  std::size_t last, bool accumulate) {
  // A panel's rows (quant::panel_bytes of weights), widened: twice its bytes, still in L2.
  const std::size_t stride = (x.cols + 15) / 16 * 16, group = quant::panel_rows(2 * x.cols);
  thread_local AlignedVector<float> panel;
  if (panel.size() < group * stride) panel.resize(group * stride);
  for (std::size_t n0 = first; n0 < last; n0 += group) {
    const std::size_t n1 = std::min(last, n0 + group);
    float* widened = panel.data();
    for (std::size_t n = n0; n < n1; ++n) {
      const std::byte* row = w.row(n);
      for (std::size_t k = 0; k < stride; k += 16)
        _mm512_store_ps(widened + (n - n0) * stride + k, weights512<type>(row + 2 * k, x.cols - std::min(k, x.cols)));
    }
    auto tile = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
      widened_tile<NR, MR>(y, ldy, x, m0, widened + (n - n0) * stride, stride, n, accumulate);
    };
    run_tiles<4, 6>(tile, x.rows, 0, n0, n1);
  }
}

#elif defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)

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

// Outputs (m0 .. m0 + MR - 1, n0 .. n0 + NR - 1) of BF16 or F16 weights, lanes 0-7 in lo and 8-15
// in hi: each weight vector widened once for the MR rows, each x vector loaded once for the NR rows.
template <TensorType type, int NR, int MR>
[[gnu::target("f16c")]] void float_tile(float* y, std::size_t ldy, const ActivationRows& x, std::size_t m0,
                                        const std::byte* row, std::size_t n0, bool accumulate,
                                        detail::LineStream& next, std::size_t lines_each) {
  const std::byte* rows[NR];
  __m256 lo[NR][MR], hi[NR][MR];
  for (int r = 0; r < NR; ++r) {
    rows[r] = row + r * 2 * x.cols;
    for (int i = 0; i < MR; ++i) lo[r][i] = hi[r][i] = _mm256_setzero_ps();
  }
  for (std::size_t k = 0; k < x.cols; k += 16) {
    next.fetch(lines_each);
    const std::size_t rest = x.cols - k;
    __m256 w_lo[NR], w_hi[NR];
    for (int r = 0; r < NR; ++r) {
      w_lo[r] = weights256<type>(rows[r] + 2 * k, rest);
      if (rest > 8) w_hi[r] = weights256<type>(rows[r] + 2 * k + 16, rest - 8);
    }
    for (int i = 0; i < MR; ++i) {
      const float* xm = x.x + (m0 + i) * x.cols + k;
      const __m256 x_lo = load_x256(xm, rest);
      for (int r = 0; r < NR; ++r) lo[r][i] = _mm256_fmadd_ps(w_lo[r], x_lo, lo[r][i]);
      if (rest > 8) {
        const __m256 x_hi = load_x256(xm + 8, rest - 8);
        for (int r = 0; r < NR; ++r) hi[r][i] = _mm256_fmadd_ps(w_hi[r], x_hi, hi[r][i]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < MR; ++i) store_sum256(y + (m0 + i) * ldy + n0 + r, lo[r][i], hi[r][i], accumulate);
}

// 16 registers hold 2 x 2 outputs' 16 lanes (8 accumulators), their weights and x.
constexpr int rows_alone = 2, weight_rows = 2, x_rows = 2;

#endif

#if defined(__AVX2__) && !defined(TAPEGRAD_EMULATED_BATCH)
// The outputs in the level's register tiles: one x row with rows_alone weight rows, streaming;
// a few rows (batched decoding) in weight_rows by x_rows tiles over panels of weight rows that
// stay in L2 while every tile of x passes, the next panel fetched into L2 a line or so a step
// meanwhile (SmolLM2 BF16 at AVX-512, one thread: S = 4 and 16 decoding 1.07x and 1.11x the
// panels without); many rows at AVX-512 widened_rows.
template <TensorType type>
void float_rows(float* y, std::size_t ldy, const ActivationRows& x, const PackedMatrix& w, std::size_t first,
                std::size_t last, bool accumulate) {
  const std::size_t row_bytes = 2 * x.cols;
  if (x.rows == 1) {
    detail::LineStream none;
    auto tile = [&]<int NR, int MR>(std::size_t m0, std::size_t n) {
      float_tile<type, NR, MR>(y, ldy, x, m0, w.bytes.data() + n * row_bytes, n, accumulate, none, 0);
    };
    return run_tiles<rows_alone, 1>(tile, x.rows, 0, first, last);
  }
#if defined(__AVX512F__)
  if (x.rows >= widened_min_rows) return widened_rows<type>(y, ldy, x, w, first, last, accumulate);
#endif
  const std::size_t panel = quant::panel_rows(row_bytes);
  for (std::size_t n0 = first; n0 < last; n0 += panel) {
    const std::size_t n1 = std::min(last, n0 + panel), next = std::min(last, n1 + panel) - n1;
    detail::LineStream ahead(w.bytes.data() + n1 * row_bytes, row_bytes, row_bytes, next);
    const std::size_t tiles = (x.rows + x_rows - 1) / x_rows * ((n1 - n0 + weight_rows - 1) / weight_rows);
    const std::size_t steps = std::max<std::size_t>(1, tiles * (x.cols / 16));
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
#else
  table.bf16 = float_rows_portable<TensorType::BF16>, table.f16 = float_rows_portable<TensorType::F16>;
#endif
}

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
