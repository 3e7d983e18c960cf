// The machine's FMA peak, the physical limit of float arithmetic: register-only multiply-add loops,
// one per instruction set, shared by bench_kernels (beside every kernel) and bench_train (beside the
// model FLOP/s of a training step).
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "bench/bench_common.h"
#include "core/simd.h"

namespace tapegrad::bench {

// Each loop is compiled for its instruction set by a target attribute (the bench programs are built
// for the baseline) and runs only where the CPU has it. `fma_chains` independent accumulators, more
// than FMA latency x FMA ports (4 x 2 on current x86 cores), keep the loop bound by FMA throughput
// alone. SSE2 has no FMA: a multiply and an add, 2 flops all the same.
inline constexpr int fma_chains = 12;
inline constexpr long fma_iterations = 1 << 18;

__attribute__((target("avx512f"))) inline float fma_loop_avx512(float seed) {
  __m512 acc[fma_chains], x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(seed);
  for (int c = 0; c < fma_chains; ++c) acc[c] = _mm512_set1_ps(float(c));
  for (long n = 0; n < fma_iterations; ++n)
    for (int c = 0; c < fma_chains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], x, y);
  alignas(64) float lanes[16];
  float sum = 0;
  for (int c = 0; c < fma_chains; ++c) {
    _mm512_store_ps(lanes, acc[c]);
    for (float l : lanes) sum += l;
  }
  return sum;
}
__attribute__((target("avx2,fma"))) inline float fma_loop_avx2(float seed) {
  __m256 acc[fma_chains], x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(seed);
  for (int c = 0; c < fma_chains; ++c) acc[c] = _mm256_set1_ps(float(c));
  for (long n = 0; n < fma_iterations; ++n)
    for (int c = 0; c < fma_chains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], x, y);
  alignas(32) float lanes[8];
  float sum = 0;
  for (int c = 0; c < fma_chains; ++c) {
    _mm256_store_ps(lanes, acc[c]);
    for (float l : lanes) sum += l;
  }
  return sum;
}
inline float fma_loop_sse2(float seed) {
  __m128 acc[fma_chains], x = _mm_set1_ps(0.999999f), y = _mm_set1_ps(seed);
  for (int c = 0; c < fma_chains; ++c) acc[c] = _mm_set1_ps(float(c));
  for (long n = 0; n < fma_iterations; ++n)
    for (int c = 0; c < fma_chains; ++c) acc[c] = _mm_add_ps(_mm_mul_ps(acc[c], x), y);
  alignas(16) float lanes[4];
  float sum = 0;
  for (int c = 0; c < fma_chains; ++c) {
    _mm_store_ps(lanes, acc[c]);
    for (float l : lanes) sum += l;
  }
  return sum;
}

/// One level's loop and the float operations one call of it does on one thread.
struct FmaLoop {
  float (*loop)(float);
  double flops;
};
inline FmaLoop fma_loop(SimdLevel level) {
  std::size_t lanes = level == SimdLevel::avx512 ? 16 : level == SimdLevel::avx2 ? 8 : 4;
  float (*loop)(float) = level == SimdLevel::avx512 ? fma_loop_avx512
                         : level == SimdLevel::avx2 ? fma_loop_avx2
                                                    : fma_loop_sse2;
  return {loop, 2.0 * double(lanes) * fma_chains * double(fma_iterations)};
}

/// The loop once on each of `threads` OpenMP threads at the same time; each thread's sum goes to
/// sink[thread], so the work cannot be optimised away. Throws unless every sum is finite (the
/// accumulators converge to seed / (1 - x)).
inline void run_fma_loop(const FmaLoop& fma, int threads, std::vector<float>& sink) {
  sink.assign(std::size_t(threads), 0.0f);
#pragma omp parallel num_threads(threads)
  sink[std::size_t(omp_get_thread_num())] = fma.loop(1e-7f);
  for (float s : sink)
    if (!std::isfinite(s)) throw std::runtime_error("fma peak loop: a sum is not finite");
}

struct FmaPeak {
  double best_gflops = 0, median_gflops = 0;
};

/// The FMA peak of `level` on `threads` threads (flops of every thread counted): after a warm-up,
/// `samples` samples of as many loop calls as fill about 20 ms each.
inline FmaPeak measure_fma_peak(SimdLevel level, int threads, int samples = 7) {
  FmaLoop fma = fma_loop(level);
  std::vector<float> sink;
  double once = seconds([&] { run_fma_loop(fma, threads, sink); });
  int calls = std::max(1, int(0.02 / std::max(once, 1e-6)));
  std::vector<double> gflops;
  for (int s = 0; s < samples; ++s) {
    double t = seconds([&] {
      for (int c = 0; c < calls; ++c) run_fma_loop(fma, threads, sink);
    });
    gflops.push_back(fma.flops * threads * calls / t * 1e-9);
  }
  Stats st = stats_of(gflops);
  return {st.max, st.median};
}

}  // namespace tapegrad::bench
