// The machine's read limit, the physical floor of decoding one token: how long one pass over a
// buffer of a given size takes when it is already in the caches (the model's weights between two
// decoding steps). A sum over the buffer in as many independent vector accumulators as hide the
// add latency, one loop per instruction set, so only the loads bound it.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "bench/bench_common.h"
#include "core/simd.h"

namespace tapegrad::bench {

inline constexpr int read_chains = 8;

__attribute__((target("avx512f"))) inline float read_pass_avx512(const float* x, std::size_t n) {
  __m512 acc[read_chains];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (std::size_t i = 0; i + 16 * read_chains <= n; i += 16 * read_chains)
    for (int c = 0; c < read_chains; ++c) acc[c] = _mm512_add_ps(acc[c], _mm512_loadu_ps(x + i + 16 * c));
  for (int c = 1; c < read_chains; ++c) acc[0] = _mm512_add_ps(acc[0], acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc[0]);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}
__attribute__((target("avx2"))) inline float read_pass_avx2(const float* x, std::size_t n) {
  __m256 acc[read_chains];
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (std::size_t i = 0; i + 8 * read_chains <= n; i += 8 * read_chains)
    for (int c = 0; c < read_chains; ++c) acc[c] = _mm256_add_ps(acc[c], _mm256_loadu_ps(x + i + 8 * c));
  for (int c = 1; c < read_chains; ++c) acc[0] = _mm256_add_ps(acc[0], acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  float sum = 0;
  for (float l : lanes) sum += l;
  return sum;
}
inline float read_pass_sse2(const float* x, std::size_t n) {
  __m128 acc[read_chains];
  for (auto& a : acc) a = _mm_setzero_ps();
  for (std::size_t i = 0; i + 4 * read_chains <= n; i += 4 * read_chains)
    for (int c = 0; c < read_chains; ++c) acc[c] = _mm_add_ps(acc[c], _mm_loadu_ps(x + i + 4 * c));
  for (int c = 1; c < read_chains; ++c) acc[0] = _mm_add_ps(acc[0], acc[c]);
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, acc[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

struct ReadLimit {
  double best_seconds = 0;  ///< the fastest pass over the buffer
  double best_gbps = 0;     ///< bytes / best_seconds, in GB/s
};

/// One pass over `bytes` of floats at `level` (one thread), best of `samples` samples of as many
/// back-to-back passes as fill about 20 ms each; the passes after the first find the buffer in
/// whatever cache holds it.
inline ReadLimit measure_read_limit(SimdLevel level, std::size_t bytes, int samples = 15) {
  float (*pass)(const float*, std::size_t) = level == SimdLevel::avx512 ? read_pass_avx512
                                             : level == SimdLevel::avx2 ? read_pass_avx2
                                                                        : read_pass_sse2;
  // 64-byte aligned, as a Tensor's storage is: 16 bytes off (where std::vector's memory starts),
  // every 64-byte load splits two cache lines, and a pass over 530 KB at avx512 took 7.0-8.1 us
  // against 4.0 aligned (Emerald Rapids).
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> storage(n + 16, 1.0f);
  const float* buffer = storage.data() + (64 - reinterpret_cast<std::uintptr_t>(storage.data()) % 64) % 64 / sizeof(float);
  float sink = 0;
  auto passes = [&](int count) {
    for (int p = 0; p < count; ++p) sink += pass(buffer, n);
  };
  passes(2);
  double once = seconds([&] { passes(1); });
  int count = std::max(1, int(0.02 / std::max(once, 1e-7)));
  double best = 1e30;
  for (int s = 0; s < samples; ++s) best = std::min(best, seconds([&] { passes(count); }) / count);
  if (!std::isfinite(sink)) throw std::runtime_error("read limit loop: the sum is not finite");
  return {best, double(bytes) / best * 1e-9};
}

}  // namespace tapegrad::bench
