// Shared by the bench programs: timing statistics, the machine and commit they ran on.
#pragma once

#include <cblas.h>
#include <omp.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/blas_core.h"
#include "core/simd.h"

namespace tapegrad::bench {

struct Stats {
  double median = 0, min = 0, max = 0;
};

inline Stats stats_of(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  std::size_t n = samples.size();
  double median = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  return {median, samples.front(), samples.back()};
}

/// Seconds taken by f().
template <class F>
double seconds(F&& f) {
  auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// "a,b,,c" -> {"a", "b", "c"}: the items of a comma-separated flag value.
inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

/// A flag's value as an integer of at least `least`; anything else (-1, "2x", "") throws, naming both.
inline int int_at_least(const std::string& flag, const std::string& text, int least) {
  int n = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (error != std::errc() || end != text.data() + text.size() || n < least)
    throw std::invalid_argument(fmt::format("{} takes {}, not '{}'", flag,
                                            least == 1 ? "positive integers" : fmt::format("integers of {} or more", least),
                                            text));
  return n;
}
/// A flag's value as a positive integer (int_at_least 1).
inline int positive_int(const std::string& flag, const std::string& text) { return int_at_least(flag, text, 1); }

/// Tiny Shakespeare: $TAPEGRAD_SHAKESPEARE, else the data folder beside the checkout (as the
/// suite finds it, tests/support/real_model.h).
inline std::string default_shakespeare_path() {
  if (const char* path = std::getenv("TAPEGRAD_SHAKESPEARE")) return path;
  return std::string(TAPEGRAD_SOURCE_DIR) + "/../shared/data/tinyshakespeare.txt";
}

/// A flag's comma-separated positive integers ("1,2"); an empty list or a bad item throws.
inline std::vector<int> positive_list(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (const std::string& item : split_list(text)) out.push_back(positive_int(flag, item));
  if (out.empty()) throw std::invalid_argument(fmt::format("{} needs at least one value", flag));
  return out;
}

inline std::string command_output(const std::string& command) {
  std::string out;
  if (FILE* pipe = popen((command + " 2>/dev/null").c_str(), "r")) {
    char buffer[256];
    while (fgets(buffer, sizeof buffer, pipe)) out += buffer;
    pclose(pipe);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

/// A field of /proc/<process>/status in KiB ("VmRSS", "VmHWM"), this process's by default, or -1.
inline long proc_status_kib(const std::string& field, const std::string& process = "self") {
  std::ifstream in("/proc/" + process + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  return -1;
}

/// The first value of a /proc/cpuinfo field ("model name" -> "AMD EPYC 7B13 64-Core Processor").
inline std::string cpuinfo(const std::string& field) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0 && line.find(':') != std::string::npos &&
        line.substr(0, line.find(':')).find_last_not_of(" \t") + 1 == field.size())
      return line.substr(line.find(':') + 2);
  return "unknown";
}
inline std::string cpu_model() { return cpuinfo("model name"); }

/// "AMD EPYC ... (2 cores, family 25 model 1, avx2)": the CPU and the SIMD level in use.
inline std::string machine() {
  return fmt::format("{} ({} cores, family {} model {}, {})", cpu_model(), command_output("nproc"), cpuinfo("cpu family"),
                     cpuinfo("model"), simd_level_name(simd_level()));
}

/// The line every bench's usage ends with: the SIMD level it would run at (or why none).
inline std::string simd_usage_line() {
  try {
    return fmt::format("SIMD level: {} (of {}; TAPEGRAD_SIMD=sse2|avx2|avx512 chooses another)\n",
                       simd_level_name(simd_level()), supported_simd_level_names());
  } catch (const std::exception& e) {
    return fmt::format("SIMD level: none ({})\n", e.what());
  }
}

/// The source tree's commit, with "+dirty" when it has uncommitted changes (other than the
/// results files the benchmarks themselves write).
inline std::string commit() {
  std::string dir = TAPEGRAD_SOURCE_DIR;
  std::string hash = command_output("git -C '" + dir + "' rev-parse --short HEAD");
  if (hash.empty()) return "unknown";
  if (!command_output("git -C '" + dir + "' status --porcelain --untracked-files=no -- . ':!bench/results'").empty())
    hash += "+dirty";
  return hash;
}

inline std::string today() { return command_output("date -u +%Y-%m-%d"); }

/// Prints a warning line when OpenBLAS's kernels do not match the SIMD level in use (gemm then runs
/// its own packed kernel for every product), so that no figure hides it.
inline void print_blas_warning() {
  if (std::string warning = blas_mismatch_warning(); !warning.empty()) fmt::print("{}\n", warning);
}

/// The header of a results file: CPU (model, family, model number), cores, the SIMD level in use
/// and whether the rest was built with -march=native, the OpenBLAS kernel, commit, UTC time, and
/// the load average before the run (how busy the shared machine was).
inline nlohmann::json run_header() {
  return {{"machine", {{"cpu", cpu_model()}, {"cpu_family", cpuinfo("cpu family")}, {"cpu_model_number", cpuinfo("model")},
                       {"nproc", omp_get_num_procs()}, {"simd_level", simd_level_name(simd_level())},
                       {"simd_supported", supported_simd_level_names()}, {"native_build", TAPEGRAD_NATIVE_BUILD != 0},
                       {"openblas_core", openblas_get_corename()}, {"blas_serves_level", blas_serves(simd_level())}}},
          {"commit", commit()},
          {"date", command_output("date -u +%Y-%m-%dT%H:%M:%SZ")},
          {"loadavg_before", command_output("cat /proc/loadavg")}};
}

/// Writes a results file whole or not at all (a temporary beside it, then a rename), creating its
/// folder, and says so; a failure throws naming the path.
inline void write_results(const std::string& path, const nlohmann::json& results) {
  namespace fs = std::filesystem;
  if (fs::path dir = fs::path(path).parent_path(); !dir.empty()) fs::create_directories(dir);
  const std::string temporary = path + ".tmp";
  std::ofstream out(temporary);
  out << results.dump(2) << "\n";
  out.close();
  if (!out) {
    std::error_code ignored;
    fs::remove(temporary, ignored);
    throw std::runtime_error(path + ": cannot write the results file");
  }
  fs::rename(temporary, path);
  fmt::print("  wrote {}\n", path);
}

}  // namespace tapegrad::bench
