// Helpers for the tests that run the built example programs (tests/examples/): start a program
// with its output in files (support/child_process.h), wait for it, a small generated corpus, the
// tiny training run, and checks on checkpoint files and temporary files.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/random.h"
#include "io/safetensors.h"
#include "support/child_process.h"
#include "support/helpers.h"

namespace tapegrad::test {

struct Result {
  int status = -1;  // the exit status, or 128 + the signal that ended the process
  std::string out, err;
};

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

/// The folder of this test process's files: stdout and stderr of run(), and the work_dir()s.
inline std::filesystem::path programs_dir() {
  return process_dir() / "programs";
}

/// A fresh folder for one test case.
inline std::filesystem::path work_dir(const std::string& name) {
  std::filesystem::path dir = programs_dir() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// About 6 KB of made-up sentences (with one non-ASCII character), the same on every run.
inline std::filesystem::path write_corpus(const std::filesystem::path& dir) {
  const char* words[] = {"the", "cat", "sat",    "on",  "a",   "mat", "and",   "dog", "ran", "to",   "café", "with",
                         "her", "old", "friend", "who", "was", "not", "there", "yet", "so",  "they", "left", "home"};
  Rng rng(7);
  std::string text;
  while (text.size() < 6000) {
    std::string sentence;
    const std::uint64_t length = 4 + rng.below(8);
    for (std::uint64_t i = 0; i < length; ++i)
      sentence += std::string(i ? " " : "") + words[rng.below(std::size(words))];
    sentence[0] = char(sentence[0] - 'a' + 'A');
    text += sentence + (rng.below(3) == 0 ? ".\n" : ". ");
  }
  write_bytes(dir / "corpus.txt", text);
  return dir / "corpus.txt";
}

/// The tiny model and run every training test uses (a step takes about a millisecond).
inline std::vector<std::string> tiny(const std::filesystem::path& data, const std::filesystem::path& out, int steps) {
  return {"--data",         data.string(),
          "--out",          out.string(),
          "--d-model",      "16",
          "--heads",        "2",
          "--blocks",       "1",
          "--max-len",      "32",
          "--seq",          "16",
          "--batch",        "4",
          "--threads",      "1",
          "--eval-batches", "2",
          "--steps",        std::to_string(steps)};
}

inline std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// Starts a built program with stdout and stderr going to files; DATA and the TAPEGRAD_TEST_
/// seams are removed from its environment unless given in env.
inline pid_t start(const std::string& program, const std::vector<std::string>& args, const std::filesystem::path& out,
                   const std::filesystem::path& err, const std::vector<std::string>& env = {}) {
  const std::string path = (std::filesystem::path(TAPEGRAD_BINARY_DIR) / program).string();
  REQUIRE_MESSAGE(std::filesystem::exists(path), path << " is not built (configure with TAPEGRAD_BUILD_EXAMPLES=ON)");
  std::vector<std::string> argv = {path};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> environment = env;
  for (std::string& entry : environment_without({"DATA=", "TAPEGRAD_TEST_"})) environment.push_back(std::move(entry));
  return start_process(std::move(argv), {.out = out, .err = err, .environment = std::move(environment)});
}

/// Runs a built program to its end.
inline Result run(const std::string& program, const std::vector<std::string>& args,
                  const std::vector<std::string>& env = {}) {
  const std::filesystem::path dir = programs_dir();
  std::filesystem::create_directories(dir);
  const std::filesystem::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  Result r;
  r.status = wait_for(start(program, args, out, err, env));
  r.out = read_bytes(out);
  r.err = read_bytes(err);
  return r;
}

/// One line, newline-terminated, naming the program: what every failure prints on stderr.
inline bool one_error_line(const Result& r, const std::string& program) {
  return r.err.starts_with(program + ": ") && r.err.ends_with("\n") &&
         std::count(r.err.begin(), r.err.end(), '\n') == 1;
}

/// Every tensor of two training checkpoints, compared bit for bit, and their metadata.
inline void check_same_tensors(const std::filesystem::path& a, const std::filesystem::path& b) {
  SafetensorsFile fa = read_safetensors(a.string()), fb = read_safetensors(b.string());
  REQUIRE(fa.tensors.size() == fb.tensors.size());
  std::size_t optimizer_tensors = 0;
  for (const auto& [name, ta] : fa.tensors) {
    REQUIRE_MESSAGE(fb.tensors.count(name), name);
    const Tensor& tb = fb.tensors.at(name);
    REQUIRE(ta.shape() == tb.shape());
    CHECK_MESSAGE(std::memcmp(ta.data(), tb.data(), ta.bytes()) == 0, name << " differs");
    optimizer_tensors += name.starts_with("optim.");
  }
  CHECK(optimizer_tensors > 0);
  CHECK(fa.metadata == fb.metadata);
}

/// Whether dir holds a file of an unfinished atomic write ("<name>.tmp.<pid>").
inline bool has_temporary_files(const std::filesystem::path& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().string().find(".tmp.") != std::string::npos) return true;
  return false;
}

}  // namespace tapegrad::test
