// README.md and docs/*.md against the code: every ```cpp, ```python or ```cmake block is a copy of a
// file the suite compiles or runs (named by <!-- from PATH --> above it), every ```sh command runs
// a program, script or flag that exists; and no page names a machine path, the spec or an issue.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot read " << path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

struct Block {
  std::string page, language, from;  // from: the PATH of a preceding <!-- from PATH -->
  std::size_t line = 0;              // of the opening fence, 1-based
  std::vector<std::string> lines;
};

std::vector<Block> blocks_of(const fs::path& page) {
  const std::vector<std::string> lines = lines_of(slurp(page));
  std::vector<Block> blocks;
  const std::regex from(R"(^<!-- from (\S+) -->$)");
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (!lines[i].starts_with("```")) continue;
    Block block{page.filename().string(), lines[i].substr(3), "", i + 1, {}};
    std::smatch m;
    for (std::size_t j = i; j-- > 0;) {
      if (lines[j].empty()) continue;
      if (std::regex_match(lines[j], m, from)) block.from = m[1];
      break;
    }
    std::size_t j = i + 1;
    for (; j < lines.size() && !lines[j].starts_with("```"); ++j) block.lines.push_back(lines[j]);
    REQUIRE_MESSAGE(j < lines.size(), block.page << ":" << block.line << ": the block is not closed");
    blocks.push_back(std::move(block));
    i = j;
  }
  return blocks;
}

std::vector<fs::path> pages() {
  const fs::path root = TAPEGRAD_SOURCE_DIR;
  std::vector<fs::path> out{root / "README.md"};
  for (const auto& entry : fs::directory_iterator(root / "docs"))
    if (entry.path().extension() == ".md") out.push_back(entry.path());
  std::sort(out.begin() + 1, out.end());
  return out;
}

bool contains_run(const std::vector<std::string>& file, const std::vector<std::string>& run) {
  if (run.empty() || run.size() > file.size()) return false;
  for (std::size_t i = 0; i + run.size() <= file.size(); ++i)
    if (std::equal(run.begin(), run.end(), file.begin() + std::ptrdiff_t(i))) return true;
  return false;
}

// The --help text of a built program (cached), or "" when it is not built.
const std::string& help_of(const std::string& program) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(program);
  if (it != cache.end()) return it->second;
  const fs::path exe = fs::path(TAPEGRAD_BINARY_DIR) / program;
  std::string text;
  if (fs::exists(exe)) {
    FILE* pipe = ::popen(("'" + exe.string() + "' --help 2>&1").c_str(), "r");
    REQUIRE(pipe != nullptr);
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) text.append(buffer, n);
    ::pclose(pipe);
  }
  return cache.emplace(program, text).first->second;
}

// The commands of a ```sh block: continuation lines joined, comments and blank lines dropped.
std::vector<std::string> commands_of(const Block& block) {
  std::vector<std::string> commands;
  std::string current;
  for (std::string line : block.lines) {
    if (current.empty() && (line.empty() || line.starts_with("#"))) continue;
    const bool continued = !line.empty() && line.back() == '\\';
    if (continued) line.pop_back();
    current += line + " ";
    if (!continued) commands.push_back(current), current.clear();
  }
  if (!current.empty()) commands.push_back(current);
  return commands;
}

void check_command(const Block& block, const std::string& command) {
  const fs::path root = TAPEGRAD_SOURCE_DIR;
  const std::string cmake = slurp(root / "CMakeLists.txt");
  // Drop a trailing comment, then look at the words.
  static const std::regex comment(R"(\s#\s.*$)"), built_program(R"(build/(\w+))"), cmake_option(R"(-D(\w+)=.*)"),
      long_flag(R"((--[a-z][a-z0-9-]*)(=.*)?)");
  std::string words = std::regex_replace(command, comment, "");
  std::istringstream in(words);
  std::string program;  // the built program whose flags follow, if any
  for (std::string word; in >> word;) {
    if (word == "|" || word == "&&" || word == ";" || word.starts_with(">")) {
      program.clear();
      continue;
    }
    std::smatch m;
    if (std::regex_match(word, m, built_program)) {
      program = m[1];
      // Its --help is read only for the flags that follow: a program without flags (spirals) may
      // have no --help, and running it would train it.
      const bool built = fs::exists(fs::path(TAPEGRAD_BINARY_DIR) / program);
      if (!built && program.starts_with("bench_") && !TAPEGRAD_BUILT_BENCH) {
        MESSAGE(block.page << ": not checked, the benchmarks are not built: " << word);
        program.clear();
        continue;
      }
      CHECK_MESSAGE(built, block.page << ":" << block.line << ": no program " << word << " is built (in: " << command
                                      << ")");
    } else if (word.starts_with("scripts/") || word.starts_with("bench/")) {
      CHECK_MESSAGE(fs::exists(root / word), block.page << ":" << block.line << ": no file " << word);
    } else if (std::regex_match(word, m, cmake_option) && !std::string(m[1]).starts_with("CMAKE_")) {
      CHECK_MESSAGE(cmake.find(std::string(m[1])) != std::string::npos,
                    block.page << ":" << block.line << ": CMakeLists.txt has no option " << m[1]);
    } else if (!program.empty() && std::regex_match(word, m, long_flag)) {
      const std::regex flag("(^|[\\s,\\[])" + std::string(m[1]) + "([\\s,=\\]]|$)");
      CHECK_MESSAGE(std::regex_search(help_of(program), flag),
                    block.page << ":" << block.line << ": " << program << " --help has no " << m[1]);
    }
  }
}

}  // namespace

TEST_CASE("every code block of README.md and docs/ is compiled, run or checked against the programs") {
  const fs::path root = TAPEGRAD_SOURCE_DIR;
  std::size_t checked = 0;
  for (const fs::path& page : pages()) {
    for (const Block& block : blocks_of(page)) {
      const std::string where = block.page + ":" + std::to_string(block.line);
      if (block.language == "sh") {
        for (const std::string& command : commands_of(block)) check_command(block, command);
      } else {
        REQUIRE_MESSAGE((block.language == "cpp" || block.language == "python" || block.language == "cmake"),
                        where << ": a block must be ```cpp, ```python, ```cmake or ```sh, not ```" << block.language);
        REQUIRE_MESSAGE(!block.from.empty(), where << ": a ```" << block.language
                                                   << " block needs a line <!-- from PATH --> before it");
        // The library's own sources count too: every test is built on them.
        CHECK_MESSAGE((block.from.starts_with("tests/") || block.from.starts_with("examples/") ||
                       block.from.starts_with("scripts/") || block.from.starts_with("core/") ||
                       block.from.starts_with("nn/")),
                      where << ": " << block.from << " is not a file that the suite compiles or runs");
        REQUIRE_MESSAGE(fs::exists(root / block.from), where << ": no file " << block.from);
        CHECK_MESSAGE(contains_run(lines_of(slurp(root / block.from)), block.lines),
                      where << ": the block differs from " << block.from << " (copy the lines again)");
      }
      ++checked;
    }
  }
  CHECK(checked >= 10);
}

TEST_CASE("README.md and docs/ name no machine path and no outside document, and the README stays short") {
  // Absolute paths under the usual top-level folders of a build machine, the folder beside the
  // repository, and references to documents outside it.
  const std::regex forbidden(R"(/(work|home|root|tmp)/|\.\./shared|SPEC|[Ii]ssue \d|load average)");
  for (const fs::path& page : pages()) {
    const std::vector<std::string> lines = lines_of(slurp(page));
    for (std::size_t i = 0; i < lines.size(); ++i)
      CHECK_MESSAGE(!std::regex_search(lines[i], forbidden),
                    page.filename().string() << ":" << i + 1 << ": " << lines[i]);
    if (page.filename() == "README.md") CHECK(lines.size() <= 300);
  }
}
