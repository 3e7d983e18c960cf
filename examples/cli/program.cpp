// Exit-status rules and file helpers for the example programs.
#include "cli/program.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/simd.h"

namespace tapegrad::examples {

namespace {

/// Messages are printed as one line: any newline inside becomes "; ".
std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::string out;
  for (char c : text) {
    if (c == '\n')
      out += "; ";
    else
      out += c;
  }
  return out;
}

void print_error(const CLI::App& app, const std::string& message) {
  std::fflush(stdout);
  fmt::print(stderr, "{}: {}\n", app.get_name(), one_line(message));
}

}  // namespace

CLI::Validator non_negative() {
  return CLI::Validator(
      [](std::string& value) {
        return value.find('-') != std::string::npos ? fmt::format("must be a whole number >= 0, got {}", value)
                                                    : std::string();
      },
      "");
}

int run_program(CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  std::string simd_error;
  try {
    app.footer(fmt::format("SIMD level: {} (of {}; TAPEGRAD_SIMD=sse2|avx2|avx512 chooses another)",
                           simd_level_name(simd_level()), supported_simd_level_names()));
  } catch (const std::exception& e) {  // a bad TAPEGRAD_SIMD: reported after --help has had its chance
    simd_error = e.what();
    app.footer(fmt::format("SIMD level: none ({})", simd_error));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    print_error(app, fmt::format("{} (see --help)", e.what()));
    return 2;
  }
  try {
    if (!simd_error.empty()) throw std::runtime_error(simd_error);
    return body();
  } catch (const UsageError& e) {
    print_error(app, fmt::format("{} (see --help)", e.what()));
    return 2;
  } catch (const std::exception& e) {
    print_error(app, e.what());
    return 1;
  } catch (...) {
    print_error(app, "unexpected error of unknown type");
    return 1;
  }
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw std::runtime_error(fmt::format("{}: is a directory, not a file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) throw std::runtime_error(fmt::format("{}: read error", path));
  return bytes.str();
}

void write_file_atomically(const std::string& path, const std::string& text) {
  create_parent_directories(path);
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      throw std::runtime_error(fmt::format("{}: cannot write: {}", tmp, std::strerror(errno)));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw std::runtime_error(fmt::format("{}: cannot rename {} over it: {}", path, tmp, ec.message()));
  }
}

std::vector<std::string> remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path folder = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  const std::string prefix = fs::path(path).filename().string() + ".tmp.";
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const std::string pid_text = name.substr(prefix.size());
    if (pid_text.empty() || pid_text.size() > 9 ||
        !std::all_of(pid_text.begin(), pid_text.end(), [](unsigned char c) { return std::isdigit(c); }))
      continue;
    const pid_t pid = pid_t(std::stol(pid_text));
    // kill(pid, 0) probes without sending anything: ESRCH means no such process.
    if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code remove_error;
    if (fs::remove(it->path(), remove_error)) removed.push_back(it->path().string());
  }
  return removed;
}

void create_parent_directories(const std::string& path) {
  auto parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) throw std::runtime_error(fmt::format("{}: cannot create the folder: {}", parent.string(), ec.message()));
}

}  // namespace tapegrad::examples
