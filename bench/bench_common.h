// Shared by the bench programs: timing statistics, the machine and commit they ran on.
#pragma once

#include <cblas.h>
#include <omp.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

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

/// "AMD EPYC 7B13 64-Core Processor"
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

/// "AMD EPYC ... (2 cores)"
inline std::string machine() { return cpu_model() + " (" + command_output("nproc") + " cores)"; }

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

/// The header of a results file: CPU, cores and OpenBLAS kernel, commit, UTC time, and the load
/// average before the run (how busy the shared machine was).
inline nlohmann::json run_header() {
  return {{"machine", {{"cpu", cpu_model()}, {"nproc", omp_get_num_procs()},
                       {"openblas_core", openblas_get_corename()}}},
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
