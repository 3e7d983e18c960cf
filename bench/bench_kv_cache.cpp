// bench_kv_cache: decoding speed of rotary_decoder(65, 64, 4, 2, 256), greedy.
//  - One sequence (the seed's benchmark): a prompt of 8, 100 new tokens, 1 thread, with the KV
//    cache and with the full forward per token.
//    Beside it, the floor of a step: one pass over the weights' bytes in cache (bench/read_limit.h).
//  - Batched: S = 1, 8, 64 sequences, each its own prompt of 8, prefilled in one pass, then 100
//    new tokens each, one step for all S per token; at 1 and 2 threads; tokens/s = S * 100 / time.
// One warm-up, then medians of the repeats. Writes bench/results/kv_cache_cpu.json.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "bench/bench_common.h"
#include "bench/read_limit.h"
#include "core/kernels.h"
#include "nn/generate.h"
#include "core/random.h"
#include "nn/models/rotary_decoder.h"

using namespace tapegrad;

int main(int argc, char** argv) try {
  int repeats = 5;
  std::vector<std::size_t> batch_sizes = {1, 8, 64};  // --sizes, --threads: only these batched runs (to profile one)
  std::vector<int> thread_counts = {1, 2};
  std::string out_path = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/results/kv_cache_cpu.json";
  const std::string usage = "usage: bench_kv_cache [--repeats N] [--sizes S,S,...] [--threads T,T,...] [--out PATH]\n" +
                            bench::simd_usage_line();
  try {
    for (int i = 1; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg == "--help") {
        fmt::print("{}", usage);
        return 0;
      }
      if (arg == "--repeats" && i + 1 < argc) {
        repeats = bench::positive_int(arg, argv[++i]);
      } else if (arg == "--out" && i + 1 < argc) {
        out_path = argv[++i];
      } else if (arg == "--sizes" && i + 1 < argc) {
        batch_sizes.clear();
        for (int size : bench::positive_list(arg, argv[++i])) batch_sizes.push_back(std::size_t(size));
      } else if (arg == "--threads" && i + 1 < argc) {
        thread_counts = bench::positive_list(arg, argv[++i]);
      } else {
        fmt::print(stderr, "{}", usage);
        return 2;
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_kv_cache: bad argument: {}\n", e.what());
    return 2;
  }
  set_num_threads(1);  // decoding one token is far too small to split
  nn::RotaryDecoder model = nn::rotary_decoder(65, 64, 4, 2, 256);
  std::vector<std::int32_t> prompt = {18, 47, 56, 57, 58, 1, 15, 47};  // "First Ci" in tiny-Shakespeare ids
  nn::GenerateOptions cached{.max_new = 100, .sampling = {.temperature = 0.0f}};
  nn::GenerateOptions uncached = cached;
  uncached.use_cache = false;

  // Check before timing: both paths produce the same 100 tokens.
  auto a = nn::generate(model, prompt, cached).tokens, b = nn::generate(model, prompt, uncached).tokens;
  if (a != b || a.size() != 100) {
    fmt::print(stderr, "bench_kv_cache: cached and uncached generation disagree\n");
    return 1;
  }
  auto measure = [&](const nn::GenerateOptions& options) {
    nn::generate(model, prompt, options);  // warm-up
    std::vector<double> samples;
    for (int r = 0; r < repeats; ++r) samples.push_back(bench::seconds([&] { nn::generate(model, prompt, options); }));
    return bench::stats_of(samples);
  };
  bench::Stats with = measure(cached), without = measure(uncached);

  // Batched: S prompts, one prefill pass, then 99 steps of S tokens (100 new tokens each).
  nlohmann::json batched;
  for (std::size_t S : batch_sizes) {
    std::vector<std::vector<std::int32_t>> prompts;
    Rng rng(S);
    for (std::size_t s = 0; s < S; ++s) {
      prompts.emplace_back();
      for (int t = 0; t < 8; ++t) prompts.back().push_back(std::int32_t(rng.below(65)));
    }
    nn::KVCache cache = model.make_cache(S);
    std::vector<std::int32_t> tokens(S);
    auto decode = [&] {
      cache.reset();
      Tensor logits = model.prefill(prompts, cache);
      for (std::size_t s = 0; s < S; ++s)
        tokens[s] = nn::argmax(std::span<const float>(logits.data() + (8 * s + 7) * 65, 65));
      for (int t = 1; t < 100; ++t) {
        std::span<const float> rows = model.step(tokens, cache);
        for (std::size_t s = 0; s < S; ++s) tokens[s] = nn::argmax(rows.subspan(s * 65, 65));
      }
    };
    for (int threads : thread_counts) {
      set_num_threads(threads);
      decode();  // warm-up
      std::vector<double> samples;
      for (int r = 0; r < repeats; ++r) samples.push_back(bench::seconds(decode));
      bench::Stats st = bench::stats_of(samples);
      double tokens_per_s = double(S) * 100 / st.median;
      batched[std::to_string(S)]["threads"][std::to_string(threads)] = {
          {"tokens_per_s", tokens_per_s}, {"median_s", st.median}, {"min_s", st.min}, {"max_s", st.max}};
      fmt::print("  batched S={:<3} {} thread{}: median {:8.3f} ms  {:9.0f} tokens/s\n", S, threads,
                 threads > 1 ? "s" : " ", st.median * 1e3, tokens_per_s);
    }
    set_num_threads(1);
  }
  // A token's step reads every weight once but the embedding table, of which one row: its floor is
  // one pass over that many bytes at the machine's read rate from cache.
  const nn::RotaryDecoderConfig& shape = model.config();
  const std::size_t weight_bytes = (model.num_params() - (shape.vocab - 1) * shape.d_model) * sizeof(float);
  const bench::ReadLimit read = bench::measure_read_limit(simd_level(), weight_bytes);
  const double step_s = with.median / 100;
  double speedup = without.median / with.median;
  fmt::print("bench_kv_cache: rotary_decoder(65, 64, 4, 2, 256), prompt 8, 100 new tokens, greedy, 1 thread, {} repeats; {}\n",
             repeats, bench::machine());
  fmt::print("  cache     median {:8.3f} ms  (min {:.3f}, max {:.3f})  {:6.1f} us/token\n", with.median * 1e3,
             with.min * 1e3, with.max * 1e3, with.median * 1e4);
  fmt::print("  floor     one pass over the {:.0f} KB of weights in cache: {:.2f} us ({:.0f} GB/s, best of 15 samples); "
             "the median step is {:.1f}x that\n",
             weight_bytes / 1024.0, read.best_seconds * 1e6, read.best_gbps, step_s / read.best_seconds);
  fmt::print("  no cache  median {:8.3f} ms  (min {:.3f}, max {:.3f})\n", without.median * 1e3, without.min * 1e3,
             without.max * 1e3);
  fmt::print("  speedup   {:.1f}x; vs the seed's 0.055 s with the cache: {:.1f}x faster\n", speedup, 0.055 / with.median);

  nlohmann::json j;
  j["benchmark"] = "kv_cache";
  j["model"] = {{"vocab", 65}, {"d_model", 64}, {"n_heads", 4}, {"n_blocks", 2}, {"max_len", 256}};
  j["prompt_len"] = prompt.size();
  j["new_tokens"] = 100;
  j["repeats"] = repeats;
  j["threads"] = 1;
  j["cache"] = {{"median_s", with.median}, {"min_s", with.min}, {"max_s", with.max}};
  j["no_cache"] = {{"median_s", without.median}, {"min_s", without.min}, {"max_s", without.max}};
  j["speedup_median"] = speedup;
  j["weights_read_floor"] = {{"bytes", weight_bytes},
                             {"best_pass_s", read.best_seconds},
                             {"best_gbps", read.best_gbps},
                             {"median_step_over_floor", step_s / read.best_seconds}};
  j["batched"] = batched;
  j["batched_note"] = "S sequences, each its own prompt of 8 tokens prefilled in one pass, then 100 new greedy tokens each "
                      "(one step for all S per token); tokens_per_s = S * 100 / median time";
  j["seed_reference"] = {{"cache_s", 0.055}, {"no_cache_s", 1.383}, {"speedup", 25.1}, {"framework", "JAX"}};
  j.update(bench::run_header());
  bench::write_results(out_path, j);
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_kv_cache: {}\n", e.what());
  return 1;
}
