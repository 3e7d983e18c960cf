// What every example program shares: one-line errors with the right exit status (2 for a bad
// argument, 1 for a failure), CLI11 parsing folded into that rule, and small file helpers.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tapegrad::examples {

/// A bad command-line value found after parsing (exit status 2, like CLI11's own errors).
class UsageError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// A CLI11 check for unsigned options: CLI11 would wrap "-3" around to a huge count.
CLI::Validator non_negative();

/// Parses argv with app and runs body, turning every outcome into an exit status: --help prints
/// the help and returns 0; a parse error or UsageError prints "<program>: <message>" as one line
/// on stderr and returns 2; any other exception prints the same way and returns 1.
int run_program(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

/// The whole file as bytes; throws std::runtime_error naming the path when it cannot be read.
std::string read_file(const std::string& path);
/// Writes text to path + ".tmp.<pid>" and renames it over path, so readers never see half a file.
void write_file_atomically(const std::string& path, const std::string& text);
/// Removes the "<path>.tmp.<pid>" files that write_file_atomically and write_safetensors leave
/// behind when their process is killed mid-write, when no process <pid> exists any more; returns
/// the names removed. Such files are never read, so one left in place only wastes space; call
/// this only while no other program may be writing path (train holds its OutputLock).
std::vector<std::string> remove_stale_temporaries(const std::string& path);
/// Creates the folder that will hold path, if any is missing.
void create_parent_directories(const std::string& path);

}  // namespace tapegrad::examples
