// The machine's read limits, the physical floor of decoding one token: how long one pass over a
// buffer of a given size takes when it is already in the caches (a small model's weights between
// two decoding steps), and the memory's read bandwidth, from passes over a buffer much larger than
// the last-level cache (a real model's weights). A sum over the buffer in as many independent
// vector accumulators as hide the add latency, one loop per instruction set, so only the loads
// bound it.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
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

inline float (*read_pass_at(SimdLevel level))(const float*, std::size_t) {
  return level == SimdLevel::avx512 ? read_pass_avx512 : level == SimdLevel::avx2 ? read_pass_avx2 : read_pass_sse2;
}

struct ReadLimit {
  double best_seconds = 0;  ///< the fastest pass over the buffer
  double best_gbps = 0;     ///< bytes / best_seconds, in GB/s
};

/// One pass over `bytes` of floats at `level` (one thread), best of `samples` samples of as many
/// back-to-back passes as fill about 20 ms each; the passes after the first find the buffer in
/// whatever cache holds it.
inline ReadLimit measure_read_limit(SimdLevel level, std::size_t bytes, int samples = 15) {
  float (*pass)(const float*, std::size_t) = read_pass_at(level);
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

/// The size of the largest cache of cpu0 (Linux's /sys/devices/system/cpu/cpu0/cache), 0 if unknown.
inline std::size_t last_level_cache_bytes() {
  std::size_t largest = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    std::string size;
    if (!(file >> size) || size.empty()) continue;
    const std::size_t unit = size.back() == 'K' ? 1024 : size.back() == 'M' ? 1024 * 1024 : 1;
    largest = std::max<std::size_t>(largest, std::stoull(size) * unit);
  }
  return largest;
}

/// The bytes of memory Linux says a new buffer can take without swapping (MemAvailable), 0 if unknown.
inline std::size_t available_memory_bytes() {
  std::ifstream file("/proc/meminfo");
  std::string key, unit;
  std::size_t kb = 0;
  while (file >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

/// The buffer for measure_memory_read: four times the last-level cache so that no pass finds it
/// there (a VM may report its host's whole cache: then more than it holds, which is the point),
/// at least 1 GiB, at most a quarter of the available memory.
inline std::size_t memory_read_buffer_bytes() {
  const std::size_t wanted = std::max<std::size_t>(4 * last_level_cache_bytes(), std::size_t(1) << 30);
  const std::size_t available = available_memory_bytes();
  return available > 0 ? std::min(wanted, available / 4) : wanted;
}

/// The memory's read bandwidth at `threads` threads: each sums its contiguous share of a buffer of
/// `bytes`; the fastest of `samples` passes after one that faults the pages in.
inline ReadLimit measure_memory_read(SimdLevel level, std::size_t bytes, int threads, int samples = 5) {
  float (*pass)(const float*, std::size_t) = read_pass_at(level);
  const std::size_t lanes = 16 * read_chains, n = bytes / sizeof(float) / (lanes * threads) * (lanes * threads);
  if (n == 0) throw std::invalid_argument("measure_memory_read: the buffer holds less than one block per thread");
  std::unique_ptr<float, decltype(&std::free)> buffer(static_cast<float*>(std::aligned_alloc(64, n * sizeof(float))),
                                                     &std::free);
  if (!buffer) throw std::runtime_error(fmt::format("measure_memory_read: cannot allocate {} bytes", n * sizeof(float)));
  const std::size_t share = n / threads;
  float sink = 0;
  auto passes = [&] {
    float sum = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
    sum += pass(buffer.get() + share * std::size_t(omp_get_thread_num()), share);
    sink += sum;
  };
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::ptrdiff_t i = 0; i < std::ptrdiff_t(n); ++i) buffer.get()[i] = 1.0f;
  passes();
  double best = 1e30;
  for (int s = 0; s < samples; ++s) best = std::min(best, seconds(passes));
  if (!std::isfinite(sink)) throw std::runtime_error("memory read loop: the sum is not finite");
  return {best, double(n * sizeof(float)) / best * 1e-9};
}

}  // namespace tapegrad::bench
