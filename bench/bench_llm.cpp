// bench_llm: a published model (SmolLM2-135M from its GGUF) run by tapegrad beside llama.cpp on
// the same file and threads, in one run. tapegrad dequantizes the file to float32 at load;
// llama.cpp runs the file's own blocks. Per thread count, alternating the two:
//  - pp128: one prompt of 128 tokens prefilled in one pass, tokens/s;
//  - tg128: 128 tokens decoded one at a time into an empty cache, tokens/s (llama-bench's tg128);
// and tapegrad's load time. Token ids are random (as llama-bench's); medians of the repeats after
// one warm-up. llama.cpp is llama-bench, built from the source that PyPI's llama-cpp-python
// carries (docs/benchmarks.md says how), given by --llama-bench. Writes bench/results/llm_cpu.json.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "bench/bench_common.h"
#include "core/kernels.h"
#include "core/random.h"
#include "core/tape.h"
#include "nn/pretrained.h"

using namespace tapegrad;

namespace {

// pp128 and tg128 of tapegrad: medians of `repeats` after a warm-up.
nlohmann::json time_tapegrad(const nn::LanguageModel& model, int repeats) {
  const std::size_t vocab = model.config().vocab, n = 128;
  Rng rng(1);
  std::vector<std::int32_t> tokens(n);
  for (auto& t : tokens) t = std::int32_t(rng.below(vocab));
  NoGradScope no_grad;
  nn::KVCache cache = model.make_cache(1, n);
  std::vector<double> prefill, decode;
  for (int r = 0; r <= repeats; ++r) {
    cache.reset();
    const double p = bench::seconds([&] { model.prefill(tokens, cache); });
    cache.reset();
    const double d = bench::seconds([&] {
      for (std::size_t i = 0; i < n; ++i) model.step(tokens[i], cache);
    });
    if (r > 0) prefill.push_back(p), decode.push_back(d);  // the first is the warm-up
  }
  const bench::Stats pp = bench::stats_of(prefill), tg = bench::stats_of(decode);
  return {{"pp128_tokens_per_s", n / pp.median}, {"pp128_tokens_per_s_min_max", {n / pp.max, n / pp.min}},
          {"tg128_tokens_per_s", n / tg.median}, {"tg128_tokens_per_s_min_max", {n / tg.max, n / tg.min}}};
}

// llama-bench's pp128 and tg128 (its mean of `repeats`, and its standard deviation).
nlohmann::json time_llama_cpp(const std::string& llama_bench, const std::string& model, int threads, int repeats) {
  const std::string command = fmt::format("'{}' -m '{}' -t {} -p 128 -n 128 -r {} -o json", llama_bench, model,
                                          threads, repeats);
  const std::string out = bench::command_output(command);
  const nlohmann::json runs = nlohmann::json::parse(out, nullptr, false);
  if (runs.is_discarded() || !runs.is_array() || runs.size() != 2)
    throw std::runtime_error(fmt::format("llama-bench gave no results ({}):\n{}", command, out));
  nlohmann::json result = {{"build_commit", runs[0].value("build_commit", "")}, {"command", command}};
  for (const auto& run : runs) {
    const std::string test = run.at("n_prompt").get<int>() > 0 ? "pp128" : "tg128";
    result[test + "_tokens_per_s"] = run.at("avg_ts");
    result[test + "_tokens_per_s_stddev"] = run.at("stddev_ts");
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) try {
  int repeats = 5;
  std::vector<int> thread_counts = {1, 2};
  std::string model_path, llama_bench, out_path = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/results/llm_cpu.json";
  const std::string usage =
      "usage: bench_llm --model FILE.gguf [--llama-bench PATH] [--threads T,T,...] [--repeats N] [--out PATH]\n" +
      bench::simd_usage_line();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help") {
      fmt::print("{}", usage);
      return 0;
    }
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value\n{}", arg, usage));
    if (arg == "--model") model_path = argv[++i];
    else if (arg == "--llama-bench") llama_bench = argv[++i];
    else if (arg == "--threads") thread_counts = bench::positive_list(arg, argv[++i]);
    else if (arg == "--repeats") repeats = bench::positive_int(arg, argv[++i]);
    else if (arg == "--out") out_path = argv[++i];
    else throw std::invalid_argument(fmt::format("unknown argument '{}'\n{}", arg, usage));
  }
  if (model_path.empty()) throw std::invalid_argument("--model is required\n" + usage);
  fmt::print("bench_llm: {} on {}\n", model_path, bench::machine());
  bench::print_blas_warning();

  std::optional<nn::PretrainedModel> loaded;
  const double load_seconds = bench::seconds([&] { loaded = nn::load_pretrained(model_path); });
  loaded->model.set_training(false);
  fmt::print("  tapegrad: {} loaded in {:.2f} s (dequantized to float32)\n", loaded->model.describe(), load_seconds);

  nlohmann::json results = bench::run_header();
  results["model"] = model_path;
  results["tapegrad_load_seconds"] = load_seconds;
  results["runs"] = nlohmann::json::array();
  for (int threads : thread_counts) {
    set_num_threads(threads);
    nlohmann::json run = {{"threads", threads}, {"tapegrad", time_tapegrad(loaded->model, repeats)}};
    if (!llama_bench.empty()) run["llama_cpp"] = time_llama_cpp(llama_bench, model_path, threads, repeats);
    fmt::print("  {} thread(s): tapegrad pp128 {:.1f} tokens/s, tg128 {:.1f} tokens/s", threads,
               run["tapegrad"]["pp128_tokens_per_s"].get<double>(), run["tapegrad"]["tg128_tokens_per_s"].get<double>());
    if (run.contains("llama_cpp"))
      fmt::print("; llama.cpp pp128 {:.1f}, tg128 {:.1f}", run["llama_cpp"]["pp128_tokens_per_s"].get<double>(),
                 run["llama_cpp"]["tg128_tokens_per_s"].get<double>());
    fmt::print("\n");
    results["runs"].push_back(run);
  }
  bench::write_results(out_path, results);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_llm: {}\n", e.what());
  return 1;
}
