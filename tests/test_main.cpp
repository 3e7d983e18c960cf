// The one doctest main of the suite (kept apart: it is the slowest translation unit to compile).
// With TAPEGRAD_SIMD unset, it runs the whole suite once per SIMD level this CPU supports and once
// at the emulated 16-lane test level (emulated16), each in a child process with TAPEGRAD_SIMD set
// (the example programs the tests start inherit it), as many at once as there are cores; with
// TAPEGRAD_SIMD set, it runs the suite once at that level.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "core/simd.h"
#include "support/helpers.h"

using namespace tapegrad;

namespace {

// One level's run: its child process, and the file that holds what the child printed until the
// parent prints it whole (levels running side by side would otherwise interleave their lines).
struct LevelRun {
  SimdLevel level;
  std::FILE* output = nullptr;
  pid_t pid = -1;
  int status = -1;  // the child's exit status once it has ended
  int signal = 0;   // the signal that ended it, if one did
};

void start(LevelRun& run, char** argv, bool side_by_side) {
  run.output = std::tmpfile();
  std::fflush(stdout);
  std::fflush(stderr);
  run.pid = run.output ? fork() : -1;
  if (run.pid == 0) {
    int fd = fileno(run.output);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    setenv("TAPEGRAD_SIMD", std::string(simd_level_name(run.level)).c_str(), 1);
    // Threads that sleep at a barrier instead of spinning: the other levels want the cores.
    if (side_by_side) setenv("OMP_WAIT_POLICY", "passive", /*overwrite=*/0);
    execv("/proc/self/exe", argv);
    std::_Exit(127);
  }
  if (run.pid < 0) run.status = 1;
}

void print_output(LevelRun& run) {
  fmt::print("[tapegrad] == the suite at SIMD level {}\n", simd_level_name(run.level));
  if (run.pid < 0) {
    fmt::print("[tapegrad] could not start it: {}\n", run.output ? "fork failed" : "no temporary file");
    if (run.output) std::fclose(run.output);
    return;
  }
  std::rewind(run.output);
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, run.output)) > 0;) std::fwrite(buffer, 1, n, stdout);
  std::fclose(run.output);
  if (run.signal != 0) fmt::print("[tapegrad] the suite at SIMD level {} was killed by signal {} ({})\n",
                                  simd_level_name(run.level), run.signal, strsignal(run.signal));
  std::fflush(stdout);
}

// Waits for any running child and records its status; false when none is left.
bool wait_for_one(std::vector<LevelRun>& runs) {
  int status = 0;
  pid_t pid = wait(&status);
  if (pid < 0) return false;
  for (LevelRun& run : runs)
    if (run.pid == pid) {
      run.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      run.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + run.signal;
    }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const char* forced = std::getenv("TAPEGRAD_SIMD");
  if ((forced != nullptr && *forced != '\0') || context.shouldExit()) {
    if (!context.shouldExit()) fmt::print("[tapegrad] SIMD level {}\n", simd_level_name(simd_level()));
    const int failed = context.run();
    std::error_code ignored;  // the files of a run that passed go; a failed run's stay for a look
    if (failed == 0) std::filesystem::remove_all(test::process_dir(), ignored);
    return failed;
  }
  std::vector<LevelRun> runs;
  for (SimdLevel level : testable_simd_levels()) runs.push_back({level});
  const std::size_t cores = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  const std::size_t at_once = std::min(cores, runs.size());
  std::size_t started = 0, printed = 0;
  auto running = [&] {
    return std::count_if(runs.begin(), runs.end(), [](const LevelRun& r) { return r.pid > 0 && r.status < 0; });
  };
  while (printed < runs.size()) {
    while (started < runs.size() && std::size_t(running()) < at_once) start(runs[started++], argv, at_once > 1);
    // Each level's output in level order, as soon as it and the levels before it have ended.
    while (printed < started && runs[printed].status >= 0) print_output(runs[printed++]);
    if (printed < runs.size() && !wait_for_one(runs)) break;
  }
  // Every level named with how it ran, and the ones this machine could not run.
  std::string passed_levels, failed_levels, missing_levels;
  int failed = 0;
  auto add = [](std::string& list, std::string_view name) { list += fmt::format("{}{}", list.empty() ? "" : ", ", name); };
  for (const LevelRun& run : runs) {
    std::string name = std::string(simd_level_name(run.level)) + (run.level == SimdLevel::emulated16 ? "" : " (native)");
    if (run.status == 0) add(passed_levels, name);
    else add(failed_levels, name), ++failed;
  }
  for (SimdLevel level : {SimdLevel::sse2, SimdLevel::avx2, SimdLevel::avx512, SimdLevel::emulated16})
    if (std::none_of(runs.begin(), runs.end(), [&](const LevelRun& run) { return run.level == level; }))
      add(missing_levels, simd_level_name(level));
  fmt::print("SIMD levels: {}{}{}\n", passed_levels.empty() ? "none passed" : passed_levels + " passed",
             failed_levels.empty() ? "" : "; " + failed_levels + " FAILED",
             missing_levels.empty() ? "" : "; " + missing_levels + " not on this CPU");
  fmt::print("levels: {} passed, {} failed\n", int(runs.size()) - failed, failed);
  return failed == 0 ? 0 : 1;
}
