// The one doctest main of the suite (kept apart: it is the slowest translation unit to compile).
// With TAPEGRAD_SIMD unset, it runs the whole suite once per SIMD level this CPU supports, each
// in a child process with TAPEGRAD_SIMD set (the example programs the tests start inherit it);
// with TAPEGRAD_SIMD set, it runs the suite once at that level.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "core/simd.h"

using namespace tapegrad;

static int run_at_level(SimdLevel level, char** argv) {
  std::fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    setenv("TAPEGRAD_SIMD", std::string(simd_level_name(level)).c_str(), 1);
    execv("/proc/self/exe", argv);
    std::_Exit(127);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) < 0) return 1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const char* forced = std::getenv("TAPEGRAD_SIMD");
  if ((forced != nullptr && *forced != '\0') || context.shouldExit()) {
    if (!context.shouldExit()) fmt::print("[tapegrad] SIMD level {}\n", simd_level_name(simd_level()));
    return context.run();
  }
  int passed = 0, failed = 0;
  for (SimdLevel level : supported_simd_levels()) {
    fmt::print("[tapegrad] == the suite at SIMD level {}\n", simd_level_name(level));
    (run_at_level(level, argv) == 0 ? passed : failed) += 1;
  }
  fmt::print("SIMD levels: {} passed, {} failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
