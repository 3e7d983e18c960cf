// What every bench program shares: timing (warm-up, then median and min-max of batched samples),
// seeded inputs, checks against a reference before timing, and the machine/commit/date header of the
// results JSON.
#pragma once

#include <cblas.h>
#include <omp.h>

#include <fmt/chrono.h>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/random.h"

namespace tapegrad::bench {

using Buffer = std::vector<float>;

struct Timing {
  double median_s, min_s, max_s;  // per call
};

/// Two warm-up calls, then `samples` timings of as many calls as fill min_sample_s (so the clock's
/// resolution and call overhead stay out of short kernels), per call.
inline Timing time_calls(const std::function<void()>& call, int samples, double min_sample_s) {
  auto seconds_of = [&](int calls) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  seconds_of(1);
  int calls = std::clamp(int(std::ceil(min_sample_s / seconds_of(1))), 1, 10000);
  std::vector<double> seconds;
  for (int r = 0; r < samples; ++r) seconds.push_back(seconds_of(calls) / calls);
  std::sort(seconds.begin(), seconds.end());
  std::size_t n = seconds.size();
  return {n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2, seconds.front(), seconds.back()};
}

inline std::string format_seconds(double s) {
  return s >= 1e-3 ? fmt::format("{:.3f} ms", s * 1e3) : fmt::format("{:.1f} us", s * 1e6);
}

/// n standard-normal floats from a fixed seed.
inline Buffer random_buffer(std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  Buffer v(n);
  for (auto& x : v) x = rng.normal();
  return v;
}

/// Throws, naming what and where, unless |got - want| <= tol (1 + |want|).
inline void expect_close(const std::string& what, std::size_t index, double got, double want, double tol) {
  if (!(std::abs(got - want) <= tol * (1 + std::abs(want))))
    throw std::runtime_error(fmt::format("{}: mismatch at {}: got {}, reference {}", what, index, got, want));
}

/// Compares got[i] with want(i) at 17 indices spread over [0, n), the last one included.
inline void verify_samples(const std::string& what, const float* got, std::size_t n,
                           const std::function<double(std::size_t)>& want, double tol) {
  for (std::size_t k = 0; k <= 16; ++k) {
    std::size_t i = k == 16 ? n - 1 : (k * (n / 16) + k * 37) % n;
    expect_close(what, i, got[i], want(i), tol);
  }
}

/// The command's standard output without trailing blanks, or "unknown".
inline std::string shell_output(const std::string& command) {
  std::string text;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[256];
    while (std::fgets(buffer, sizeof buffer, pipe)) text += buffer;
    pclose(pipe);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "unknown" : text;
}

/// machine (CPU model, cpus, OpenBLAS kernel), commit of this source tree, UTC date and load average:
/// the header of every results file. The load average says how busy the shared machine was.
inline nlohmann::json run_header() {
  std::string source_dir = std::filesystem::path(__FILE__).parent_path().string();
  return {{"machine",
           {{"cpu", shell_output("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'")},
            {"nproc", omp_get_num_procs()},
            {"openblas_core", openblas_get_corename()}}},
          {"commit", shell_output(fmt::format("git -C '{}' rev-parse --short HEAD 2>/dev/null", source_dir))},
          {"date", fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::time(nullptr)))},
          {"loadavg_before", shell_output("cat /proc/loadavg")}};
}

}  // namespace tapegrad::bench
