// Shared by the bench programs: timing statistics, the machine and commit they ran on.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
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

/// "AMD EPYC ... (2 cores)"
inline std::string machine() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return model + " (" + command_output("nproc") + " cores)";
}

/// The source tree's commit, with "+dirty" when it has uncommitted changes.
inline std::string commit() {
  std::string dir = TAPEGRAD_SOURCE_DIR;
  std::string hash = command_output("git -C '" + dir + "' rev-parse --short HEAD");
  if (hash.empty()) return "unknown";
  if (!command_output("git -C '" + dir + "' status --porcelain --untracked-files=no").empty()) hash += "+dirty";
  return hash;
}

inline std::string today() { return command_output("date -u +%Y-%m-%d"); }

}  // namespace tapegrad::bench
