// Helpers shared by the tests: seeded random buffers, exception-message checks, data paths.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"

namespace tapegrad::test {

/// This test process's folder for files (the SIMD levels run side by side, each in a process of
/// its own). The suite removes it when the run passes and keeps it for a look when a test fails.
inline std::filesystem::path process_dir() {
  return std::filesystem::temp_directory_path() / ("tapegrad_test_" + std::to_string(::getpid()));
}

/// A file's whole contents; the test fails naming the path when it cannot be read.
inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot open " << path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// process_dir() / name, its folder created.
inline std::string process_path(const std::string& name) {
  std::filesystem::create_directories(process_dir());
  return (process_dir() / name).string();
}

template <class T = float>
std::vector<T> random_vector(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<T> v(n);
  for (auto& x : v) x = T(rng.normal() * scale);
  return v;
}

inline Tensor random_tensor(Shape shape, std::uint64_t seed, float scale = 1.0f) {
  Tensor t(std::move(shape));
  Rng rng(seed);
  rng.fill_normal(t, scale);
  return t;
}

/// A tensor's values, to compare with CHECK.
inline std::vector<float> values(const Tensor& t) { return {t.data(), t.data() + t.size()}; }

/// n token ids uniform in [0, vocab) from a fixed seed.
inline std::vector<std::int32_t> random_ids(std::size_t n, std::size_t vocab, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> ids(n);
  for (auto& id : ids) id = std::int32_t(rng.below(vocab));
  return ids;
}

/// Runs f, requires it to throw E, and returns the message (for CHECK on its contents).
template <class E = std::exception, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("expected an exception");
  return {};
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// bench/.venv's python when it imports every module of `modules` ("peft, transformers"), else an
/// empty string: then the test fails under CI (the environment variable CI set), where
/// scripts/test.sh has set the venv up (scripts/python_tools.sh), and elsewhere says why it skips.
inline std::string bench_python(const std::string& modules) {
  const std::string python = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/.venv/bin/python";
  if (std::filesystem::exists(python) &&
      std::system(("'" + python + "' -c 'import " + modules + "' >/dev/null 2>&1").c_str()) == 0)
    return python;
  const std::string why = "no " + python + " importing " + modules + " (set it up with `bash scripts/python_tools.sh`)";
  if (std::getenv("CI") != nullptr) FAIL(why);
  MESSAGE("skipped: ", why);
  return {};
}

}  // namespace tapegrad::test
