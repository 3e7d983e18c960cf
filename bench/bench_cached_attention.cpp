// bench_cached_attention: the attention of batched decoding over a KV cache, alone. SmolLM2-135M's
// shape (9 heads, 3 KV heads of 64, 30 layers) and bench_llm's S = 16 workload: 16 sequences
// stepping from position 128 to 255, one query each, over a 16-bit cache (as llama.cpp's) or a
// float one, one thread. Two cases per cache type:
//  - from memory: every sequence-layer its own cache, 16 x 30 of them (71 MB of halves read a step
//    on average), as in a real step;
//  - from L2: every call reads the same sequence-layer's cache, so only the arithmetic counts.
// Milliseconds a step (30 layers x 16 sequences) and the keys' and values' bytes over that time.
// Checked first: the 16-bit kernel gives the float kernel's bits over the same values.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <vector>

#include "bench/bench_common.h"
#include "core/aligned.h"
#include "core/kernels.h"
#include "core/random.h"

using namespace tapegrad;

namespace {

constexpr std::size_t sequences = 16, layers = 30, heads = 9, kv_heads = 3, head_dim = 64, capacity = 256;
constexpr std::size_t first_position = 128, kv_dim = kv_heads * head_dim;
constexpr std::size_t slot = capacity * kv_dim;  // elements of one sequence-layer's keys (or values)

// One step's attention: every layer, every sequence, one query at `position`. `spread`: each
// sequence-layer reads its own slot of the cache (from memory); otherwise slot 0 (from L2).
template <class Element>
void step(const Element* keys, const Element* values, const std::vector<float>& q, std::vector<float>& y,
          std::vector<float>& scratch, std::size_t position, bool spread) {
  kernels::AttentionShape shape{1, 1, position + 1, heads, head_dim, position, kv_heads};
  shape.kv_capacity = capacity;
  for (std::size_t l = 0; l < layers; ++l)
    for (std::size_t s = 0; s < sequences; ++s) {
      const std::size_t at = spread ? (s * layers + l) * slot : 0;
      const float* qs = q.data() + s * heads * head_dim;
      float* ys = y.data() + s * heads * head_dim;
      if constexpr (std::is_same_v<Element, float>)
        kernels::cached_attention_forward<float>(ys, qs, keys + at, values + at, shape, scratch.data());
      else
        kernels::cached_attention_forward_f16<float>(ys, qs, keys + at, values + at, shape, scratch.data());
    }
}

}  // namespace

int main(int argc, char** argv) try {
  int repeats = 3;
  std::string out_path = std::string(TAPEGRAD_SOURCE_DIR) + "/bench/results/cached_attention_cpu.json";
  const std::string usage = "usage: bench_cached_attention [--repeats N] [--out PATH]\n" + bench::simd_usage_line();
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--help") {
        fmt::print("{}", usage);
        return 0;
      }
      if (arg == "--repeats" && i + 1 < argc) repeats = bench::positive_int(arg, argv[++i]);
      else if (arg == "--out" && i + 1 < argc) out_path = argv[++i];
      else {
        fmt::print(stderr, "{}", usage);
        return 2;
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_cached_attention: bad argument: {}\n", e.what());
    return 2;
  }
  set_num_threads(1);
  // Values k / 1024 with |k| <= 512 are exact in halves: both caches hold the same numbers.
  const std::size_t count = sequences * layers * slot;
  Rng rng(7);
  std::vector<float> exact(count);
  HugePageVector<float> keys32(count), values32(count);
  HugePageVector<std::uint16_t> keys16(count), values16(count);
  for (auto* cache : {&keys32, &values32}) {
    for (float& e : exact) e = float(int(rng.below(1025)) - 512) / 1024.0f;
    std::copy(exact.begin(), exact.end(), cache->begin());
  }
  kernels::round_to_halves<float>(keys16.data(), keys32.data(), count);
  kernels::round_to_halves<float>(values16.data(), values32.data(), count);
  std::vector<float> q(sequences * heads * head_dim), y(q.size()), y16(q.size());
  for (float& e : q) e = float(int(rng.below(1025)) - 512) / 512.0f;
  std::vector<float> scratch(heads * (capacity + kernels::key_block + 1) + 64);

  step(keys32.data(), values32.data(), q, y, scratch, capacity - 1, true);
  step(keys16.data(), values16.data(), q, y16, scratch, capacity - 1, true);
  if (std::memcmp(y.data(), y16.data(), y.size() * sizeof(float)) != 0) {
    fmt::print(stderr, "bench_cached_attention: the 16-bit cache's outputs differ from the float cache's\n");
    return 1;
  }

  nlohmann::json results;
  fmt::print("bench_cached_attention: SmolLM2's attention (9 heads, 3 KV heads of 64, 30 layers), 16 sequences, "
             "positions {}-{}, 1 thread, best of {}; {}\n",
             first_position, capacity - 1, repeats, bench::machine());
  auto measure = [&](auto keys, auto values, const char* type, std::size_t element_bytes) {
    for (bool spread : {true, false}) {
      std::vector<double> samples;
      for (int r = 0; r < repeats; ++r)
        samples.push_back(bench::seconds([&] {
          for (std::size_t position = first_position; position < capacity; ++position)
            step(keys, values, q, y, scratch, position, spread);
        }));
      const double step_s = bench::stats_of(samples).min / double(capacity - first_position);
      // Keys and values of positions 0..p read at each step, on average p = (128 + 255) / 2 + 1.
      const double bytes = 2.0 * sequences * layers * ((first_position + capacity - 1) / 2.0 + 1) * kv_dim * element_bytes;
      const char* where = spread ? "memory" : "L2";
      fmt::print("  {:5} cache from {:6}: {:6.2f} ms a step, {:5.1f} GB/s of keys and values\n", type, where,
                 step_s * 1e3, bytes / step_s / 1e9);
      results[type][where] = {{"ms_per_step", step_s * 1e3}, {"gb_per_s", bytes / step_s / 1e9}};
    }
  };
  measure(keys16.data(), values16.data(), "f16", 2);
  measure(keys32.data(), values32.data(), "f32", 4);
  results["benchmark"] = "cached_attention";
  results["workload"] = {{"sequences", sequences}, {"layers", layers},        {"heads", heads},
                         {"kv_heads", kv_heads},   {"head_dim", head_dim},    {"positions", {first_position, capacity - 1}},
                         {"threads", 1},           {"repeats", repeats}};
  results.update(bench::run_header());
  bench::write_results(out_path, results);
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_cached_attention: {}\n", e.what());
  return 1;
}
