// bench_llm: a published model (a GGUF file) decoded by tapegrad beside llama.cpp on the same file
// and threads, in one run. Per weight format of tapegrad's (--weights; llama.cpp runs the file's own
// blocks) and per thread count, alternating the two programs:
//  - pp128, pp512: one prompt of that many tokens prefilled in one pass, tokens/s;
//  - tg128: 128 tokens decoded one at a time into an empty cache, tokens/s (llama-bench's tg128);
//  - batched S = 4, 16: S sequences, each with its own prompt of 128 tokens, then 128 steps of one
//    token for every sequence: S * 128 / the steps' time (llama-batched-bench's S_TG);
// tapegrad's load time; the memory's read bandwidth at each thread count (bench/read_limit.h), and
// each tg128 as a fraction of it: tokens/s * the bytes a token reads / the bandwidth. Token ids
// are random (as llama.cpp's tools draw them). The programs take turns, a round of every test each
// (after a warm-up: llama-bench's own), --repeats rounds: a VM whose speed drifts over minutes then
// moves both sides of a round alike. Each figure is the median of its rounds, and each ratio
// tapegrad / llama.cpp the median of the rounds' ratios. tapegrad's KV cache holds floats, or
// halves with --kv-cache f16 (llama.cpp's tools hold halves: their default). llama.cpp is llama-bench and llama-batched-bench, built from the
// source PyPI's llama-cpp-python carries (docs/benchmarks.md says how). Writes
// bench/results/llm_cpu.json.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <map>
#include <optional>
#include <sstream>

#include "bench/bench_common.h"
#include "bench/read_limit.h"
#include "core/kernels.h"
#include "core/random.h"
#include "core/tape.h"
#include "io/gguf.h"
#include "nn/packed_weights.h"
#include "nn/pretrained.h"

using namespace tapegrad;

namespace {

constexpr std::size_t prompt_lengths[] = {128, 512}, new_tokens = 128, batched_prompt = 128;
constexpr std::size_t batch_sizes[] = {4, 16};

std::vector<std::int32_t> random_tokens(std::size_t count, std::size_t vocab, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> tokens(count);
  for (auto& t : tokens) t = std::int32_t(rng.below(vocab));
  return tokens;
}

// The bytes one decoding step reads: every parameter and packed matrix once, but of the token
// embedding only a row unless it is also the head (tied: no layer or parameter named head).
std::size_t tapegrad_bytes_per_token(nn::LanguageModel& model) {
  std::size_t bytes = 0, embedding = 0, row = 0;
  const std::map<std::string, std::size_t> packed = nn::packed_bytes(model.module());
  bool tied = !packed.contains("head");
  for (const auto& p : model.params()) {
    bytes += p.var.value().bytes();
    if (p.name == "embed.weight") embedding = p.var.value().bytes(), row = embedding / p.var.shape()[0];
    if (p.name == "head.weight") tied = false;
  }
  for (const auto& [name, size] : packed) bytes += size;
  if (const auto table = packed.find("embed"); table != packed.end())
    embedding = table->second, row = embedding / model.config().vocab;
  return tied ? bytes : bytes - embedding + row;
}

// The same for llama.cpp on the file's own tensors: all of them, the token embedding only when
// it is the head (no output.weight).
std::size_t file_bytes_per_token(const io::GgufFile& file) {
  std::size_t bytes = 0;
  for (const auto& t : file.tensors()) bytes += t.data.size();
  const io::GgufTensor* embedding = file.find_tensor("token_embd.weight");
  if (embedding && file.find_tensor("output.weight")) bytes -= embedding->data.size();
  return bytes;
}

// The rates one round of a program measures, by name: pp128, pp512, tg128, S4, S16 (tokens/s).
using Rates = std::map<std::string, double>;

// One round of pp, tg and batched decoding of tapegrad at the current thread count.
Rates time_tapegrad(const nn::LanguageModel& model, nn::KVCacheType cache_type) {
  const std::size_t vocab = model.config().vocab;
  NoGradScope no_grad;
  nn::KVCache one = model.make_cache(1, prompt_lengths[1], cache_type);
  const std::vector<std::int32_t> prompt = random_tokens(prompt_lengths[1], vocab, 1);
  // Warm-up at the longest prompt, as llama-bench warms up each test: the pass's scratch buffers
  // (kept by the cache) reach their size here, not in a timed run.
  model.prefill(prompt, one);
  Rates rates;
  for (std::size_t length : prompt_lengths) {
    one.reset();
    // llama-bench's pp also computes the last token's logits alone.
    rates[fmt::format("pp{}", length)] =
        double(length) /
        bench::seconds([&] { model.prefill(std::span(prompt).first(length), one, 0, nn::PrefillLogits::last_token); });
  }
  one.reset();
  rates[fmt::format("tg{}", new_tokens)] = double(new_tokens) / bench::seconds([&] {
    for (std::size_t i = 0; i < new_tokens; ++i) model.step(prompt[i], one);
  });
  for (std::size_t S : batch_sizes) {
    std::vector<std::vector<std::int32_t>> prompts;
    for (std::size_t s = 0; s < S; ++s) prompts.push_back(random_tokens(batched_prompt, vocab, 100 + s));
    const std::vector<std::int32_t> steps = random_tokens(S * new_tokens, vocab, 2);
    nn::KVCache cache = model.make_cache(S, batched_prompt + new_tokens, cache_type);
    model.prefill(prompts, cache, nn::PrefillLogits::last_token);
    rates[fmt::format("S{}", S)] = double(S * new_tokens) / bench::seconds([&] {
      for (std::size_t i = 0; i < new_tokens; ++i) model.step(std::span(steps).subspan(i * S, S), cache);
    });
  }
  return rates;
}

nlohmann::json parse_json(const std::string& text, const std::string& command) {
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
  if (parsed.is_discarded()) throw std::runtime_error(fmt::format("{} gave no JSON:\n{}", command, text));
  return parsed;
}

std::string llama_bench_command(const std::string& tool, const std::string& model, int threads) {
  return fmt::format("'{}' -m '{}' -t {} -p {},{} -n {} -r 1 -o json", tool, model, threads, prompt_lengths[0],
                     prompt_lengths[1], new_tokens);
}

std::string llama_batched_command(const std::string& tool, const std::string& model, int threads) {
  const std::size_t context = batch_sizes[1] * (batched_prompt + new_tokens);
  return fmt::format("'{}' -m '{}' -t {} -tb {} -c {} -npp {} -ntg {} -npl {},{} --output-format jsonl 2>/dev/null",
                     tool, model, threads, threads, context, batched_prompt, new_tokens, batch_sizes[0],
                     batch_sizes[1]);
}

// One round of llama-bench's pp and tg at `threads` (one run of each test after its warm-up).
Rates time_llama_bench(const std::string& tool, const std::string& model, int threads, std::string& build_commit) {
  const std::string command = llama_bench_command(tool, model, threads);
  const nlohmann::json runs = parse_json(bench::command_output(command), command);
  if (!runs.is_array() || runs.size() != 3) throw std::runtime_error(fmt::format("{}: expected 3 tests", command));
  build_commit = runs[0].value("build_commit", "");
  Rates rates;
  for (const auto& run : runs) {
    const int prompt = run.at("n_prompt").get<int>();
    rates[prompt > 0 ? fmt::format("pp{}", prompt) : fmt::format("tg{}", run.at("n_gen").get<int>())] =
        run.at("avg_ts").get<double>();
  }
  return rates;
}

// One round of llama-batched-bench's S_TG (tokens/s of the decoding steps) for each batch size.
Rates time_llama_batched(const std::string& tool, const std::string& model, int threads) {
  const std::string command = llama_batched_command(tool, model, threads);
  Rates rates;
  std::istringstream lines(bench::command_output(command));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    const nlohmann::json run = parse_json(line, command);
    rates[fmt::format("S{}", run.at("pl").get<int>())] = run.at("speed_tg").get<double>();
  }
  for (std::size_t S : batch_sizes)
    if (!rates.contains(fmt::format("S{}", S)))
      throw std::runtime_error(fmt::format("{}: no result for {} sequences", command, S));
  return rates;
}

// A program's rounds as a run's figures: each rate's median (pp128_tokens_per_s, ...,
// batched_tokens_per_s {"4", "16"}) and every round's rates.
nlohmann::json medians_of(const std::vector<Rates>& rounds) {
  nlohmann::json run = {{"rounds", rounds}};
  std::map<std::string, std::vector<double>> samples;
  for (const Rates& round : rounds)
    for (const auto& [name, rate] : round) samples[name].push_back(rate);
  for (const auto& [name, rates] : samples) {
    const double median = bench::stats_of(rates).median;
    if (name[0] == 'S') run["batched_tokens_per_s"][name.substr(1)] = median;
    else run[name + "_tokens_per_s"] = median;
  }
  return run;
}

// The median over the rounds of tapegrad's rate / llama.cpp's, for each rate both measured.
nlohmann::json ratios_of(const std::vector<Rates>& ours, const std::vector<Rates>& theirs) {
  std::map<std::string, std::vector<double>> samples;
  for (std::size_t r = 0; r < ours.size() && r < theirs.size(); ++r)
    for (const auto& [name, rate] : ours[r])
      if (const auto other = theirs[r].find(name); other != theirs[r].end()) samples[name].push_back(rate / other->second);
  nlohmann::json ratios = nlohmann::json::object();
  for (const auto& [name, values] : samples) ratios[name] = bench::stats_of(values).median;
  return ratios;
}

// tg128 as a fraction of the memory's read bandwidth: tokens/s * bytes per token / bytes/s.
void add_fraction(nlohmann::json& result, std::size_t bytes_per_token, double gbps) {
  const double rate = result.at(fmt::format("tg{}_tokens_per_s", new_tokens)).get<double>();
  result["tg_fraction_of_memory_read"] = rate * double(bytes_per_token) / (gbps * 1e9);
}

}  // namespace

int main(int argc, char** argv) try {
  int rounds = 3;
  std::vector<int> thread_counts = {1, 2};
  std::vector<std::string> formats = {"f32"};
  std::string model_path, llama_bench, llama_batched, kv_cache = "f32",
      out_path = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/results/llm_cpu.json";
  const std::string usage =
      "usage: bench_llm --model FILE.gguf [--weights FORMAT,...] [--kv-cache f32|f16] [--threads T,T,...]\n"
      "                 [--repeats ROUNDS] [--llama-bench PATH] [--llama-batched-bench PATH] [--out PATH]\n" +
      bench::simd_usage_line();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help") {
      fmt::print("{}", usage);
      return 0;
    }
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value\n{}", arg, usage));
    if (arg == "--model") model_path = argv[++i];
    else if (arg == "--weights") formats = bench::split_list(argv[++i]);
    else if (arg == "--kv-cache") kv_cache = argv[++i];
    else if (arg == "--llama-bench") llama_bench = argv[++i];
    else if (arg == "--llama-batched-bench") llama_batched = argv[++i];
    else if (arg == "--threads") thread_counts = bench::positive_list(arg, argv[++i]);
    else if (arg == "--repeats") rounds = bench::positive_int(arg, argv[++i]);
    else if (arg == "--out") out_path = argv[++i];
    else throw std::invalid_argument(fmt::format("unknown argument '{}'\n{}", arg, usage));
  }
  if (model_path.empty()) throw std::invalid_argument("--model is required\n" + usage);
  if (kv_cache != "f32" && kv_cache != "f16")
    throw std::invalid_argument(fmt::format("--kv-cache {}: f32 or f16\n{}", kv_cache, usage));
  const nn::KVCacheType cache_type = kv_cache == "f32" ? nn::KVCacheType::f32 : nn::KVCacheType::f16;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each figure as it comes: a run takes many minutes
  fmt::print("bench_llm: {} on {}\n", model_path, bench::machine());
  bench::print_blas_warning();
  nlohmann::json results = bench::run_header();
  results["model"] = model_path;
  results["workload"] = {{"prompt_lengths", prompt_lengths},
                         {"new_tokens", new_tokens},
                         {"batched_prompt", batched_prompt},
                         {"batch_sizes", batch_sizes},
                         {"rounds", rounds},
                         {"tapegrad_kv_cache", kv_cache},
                         {"note", "pp: the last prompt token's logits only, in both programs"}};

  const std::size_t buffer = bench::memory_read_buffer_bytes();
  std::map<int, double> gbps;
  for (int threads : thread_counts) {
    gbps[threads] = bench::measure_memory_read(simd_level(), buffer, threads).best_gbps;
    results["memory_read"]["gbps_by_threads"][std::to_string(threads)] = gbps[threads];
  }
  results["memory_read"]["buffer_bytes"] = buffer;
  results["memory_read"]["last_level_cache_bytes"] = bench::last_level_cache_bytes();
  fmt::print("  memory read over {:.0f} MB:", buffer / 1e6);
  for (int threads : thread_counts) fmt::print(" {:.1f} GB/s at {} thread(s);", gbps[threads], threads);
  fmt::print("\n");

  const std::size_t file_bytes = file_bytes_per_token(io::GgufFile::open(model_path));
  results["llama_cpp"] = {{"bytes_per_token", file_bytes}, {"runs", nlohmann::json::array()}};
  results["tapegrad"] = nlohmann::json::array();
  std::vector<nn::PretrainedModel> models;
  for (const std::string& format : formats) {
    std::optional<nn::PretrainedModel> loaded;
    const double load_seconds = bench::seconds([&] { loaded = nn::load_pretrained(model_path, {.weights = format}); });
    loaded->model.set_training(false);
    const std::size_t bytes = tapegrad_bytes_per_token(loaded->model);
    fmt::print("  tapegrad {}: {} loaded in {:.2f} s, {:.1f} MB read a token\n", format, loaded->model.describe(),
               load_seconds, bytes / 1e6);
    results["tapegrad"].push_back({{"weights", format},
                                   {"load_seconds", load_seconds},
                                   {"bytes_per_token", bytes},
                                   {"runs", nlohmann::json::array()}});
    models.push_back(std::move(*loaded));
  }
  auto print_run = [](const std::string& who, const nlohmann::json& r) {
    fmt::print("    {:<16} pp128 {:7.1f}  pp512 {:7.1f}  tg128 {:6.1f} ({:3.0f}% of the read bandwidth)  S=4 {:7.1f}  "
               "S=16 {:7.1f} tokens/s\n",
               who, r.value("pp128_tokens_per_s", 0.0), r.value("pp512_tokens_per_s", 0.0),
               r.value("tg128_tokens_per_s", 0.0), 100 * r.value("tg_fraction_of_memory_read", 0.0),
               r.contains("batched_tokens_per_s") ? r["batched_tokens_per_s"].value("4", 0.0) : 0.0,
               r.contains("batched_tokens_per_s") ? r["batched_tokens_per_s"].value("16", 0.0) : 0.0);
  };
  for (int threads : thread_counts) {
    fmt::print("  {} thread(s):\n", threads);
    set_num_threads(threads);
    std::vector<std::vector<Rates>> ours(models.size());
    std::vector<Rates> theirs;
    std::string build_commit, batched_error;
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t f = 0; f < models.size(); ++f) ours[f].push_back(time_tapegrad(models[f].model, cache_type));
      if (llama_bench.empty()) continue;
      Rates rates = time_llama_bench(llama_bench, model_path, threads, build_commit);
      if (!llama_batched.empty() && batched_error.empty()) {
        try {  // tapegrad's figures are kept when llama-batched-bench fails
          rates.merge(time_llama_batched(llama_batched, model_path, threads));
        } catch (const std::exception& e) {
          fmt::print(stderr, "bench_llm: {}\n", e.what());
          batched_error = e.what();
        }
      }
      theirs.push_back(rates);
    }
    for (std::size_t f = 0; f < models.size(); ++f) {
      nlohmann::json run = medians_of(ours[f]);
      add_fraction(run, results["tapegrad"][f]["bytes_per_token"].get<std::size_t>(), gbps[threads]);
      run["threads"] = threads;
      if (!theirs.empty()) run["ratios_to_llama_cpp"] = ratios_of(ours[f], theirs);
      print_run("tapegrad " + formats[f], run);
      results["tapegrad"][f]["runs"].push_back(run);
    }
    if (theirs.empty()) continue;
    nlohmann::json run = medians_of(theirs);
    run["build_commit"] = build_commit;
    run["llama_bench"] = llama_bench_command(llama_bench, model_path, threads);
    if (!llama_batched.empty()) run["llama_batched_bench"] = llama_batched_command(llama_batched, model_path, threads);
    if (!batched_error.empty()) run["llama_batched_bench_error"] = batched_error;
    add_fraction(run, file_bytes, gbps[threads]);
    run["threads"] = threads;
    print_run("llama.cpp (file)", run);
    results["llama_cpp"]["runs"].push_back(run);
    for (std::size_t f = 0; f < models.size(); ++f) {
      fmt::print("    ratio {:<10}", formats[f]);
      for (const auto& ratio : results["tapegrad"][f]["runs"].back()["ratios_to_llama_cpp"].items())
        fmt::print("  {} {:.2f}x", ratio.key(), ratio.value().get<double>());
      fmt::print("\n");
    }
  }
  bench::write_results(out_path, results);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_llm: {}\n", e.what());
  return 1;
}
