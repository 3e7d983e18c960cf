// bench_packed: one-sequence decoding (tg) of a published model per weight format (--weights of
// nn/pretrained.h), and the packed kernels' products of M = 1 to 512 rows beside float32's
// row_stable_matmul on the same shapes. Medians of --repeats runs, threads as given; figures are ratios within one run.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/kernels.h"
#include "core/quant/packed_matrix.h"
#include "core/simd.h"
#include "nn/pretrained.h"

using namespace tapegrad;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    out.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// Tokens per second of `tokens` greedy steps after a 16-token prompt.
double decode_rate(const nn::LanguageModel& model, std::size_t tokens) {
  std::vector<std::int32_t> prompt(16);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = std::int32_t(100 + 37 * i);
  nn::KVCache cache = model.make_cache(1, prompt.size() + tokens + 1);
  const Tensor first = model.prefill(prompt, cache);
  const std::size_t vocab = model.config().vocab;
  std::int32_t next = std::int32_t(std::max_element(first.data() + (prompt.size() - 1) * vocab,
                                                    first.data() + prompt.size() * vocab) -
                                   (first.data() + (prompt.size() - 1) * vocab));
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t t = 0; t < tokens; ++t) {
    std::span<const float> logits = model.step(next, cache);
    next = std::int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  return double(tokens) / seconds_since(start);
}

// A matrix of random K-quant blocks (random finite halves for the scales): tapegrad reads K-quants
// from files and has no quantizer for them.
quant::PackedMatrix random_k_matrix(quant::TensorType type, std::size_t rows, std::size_t cols) {
  const std::size_t block_bytes = quant::block_format(type).block_bytes;
  std::vector<std::byte> bytes(rows * cols / 256 * block_bytes);
  std::mt19937_64 random(7);
  for (std::byte& byte : bytes) byte = std::byte(random() & 0xFF);
  for (std::size_t at = 0; at < bytes.size(); at += block_bytes)
    for (std::size_t half : type == quant::TensorType::Q4_K ? std::vector<std::size_t>{0, 2} : std::vector<std::size_t>{208}) {
      const std::uint16_t bits = quant::f32_to_f16(float(random() % 1000) * 1e-5f);
      bytes[at + half] = std::byte(bits & 0xFF), bytes[at + half + 1] = std::byte(bits >> 8);
    }
  return quant::interleave_matrix(type, rows, cols, bytes);
}

// Microseconds of y (M, out) = x (M, in) W^T, float32 (in, out) rows against each packed format
// The formats take turns within
// each repeat, so that a loaded machine slows them alike; ratios are float32's time over the
// format's, and for the K-quants and Q5_0 also Q4_1's time over theirs.
void kernel_products(std::size_t in, std::size_t out, std::size_t M, int repeats) {
  // On cache lines, as a model's activations are: a std::vector's rows start 16 bytes into one,
  // and BF16's tile (its x loads split across two lines) measured 73 GFLOP/s there, 117 aligned.
  AlignedVector<float> w(in * out), x(M * in), y(M * out);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = float((i * 7919) % 1000) / 1000.0f - 0.5f;
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float((i * 104729) % 997) / 997.0f - 0.5f;
  const int calls = int(std::clamp<std::size_t>(std::size_t(4e7) / (M * in * out), 1, 20));
  auto once = [&](auto&& run) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) run();
    return seconds_since(start) / calls * 1e6;
  };
  std::vector<quant::PackedMatrix> packed;
  for (quant::TensorType type : {quant::TensorType::Q8_0, quant::TensorType::Q4_1, quant::TensorType::Q4_0,
                                 quant::TensorType::Q5_0, quant::TensorType::Q4_K, quant::TensorType::Q6_K,
                                 quant::TensorType::BF16, quant::TensorType::F16, quant::TensorType::F32}) {
    const bool k_quant = type == quant::TensorType::Q4_K || type == quant::TensorType::Q6_K;
    if (k_quant && in % 256 != 0) continue;  // K-quants need whole super-blocks
    packed.push_back(k_quant ? random_k_matrix(type, out, in) : quant::pack_matrix(w.data(), out, in, type));
  }
  std::vector<double> f32_us;
  std::vector<std::vector<double>> us(packed.size());
  for (int r = 0; r < repeats; ++r) {
    f32_us.push_back(once([&] { kernels::row_stable_matmul(y.data(), x.data(), w.data(), M, in, out, false); }));
    for (std::size_t f = 0; f < packed.size(); ++f)
      us[f].push_back(once([&] { quant::packed_matmul(y.data(), x.data(), M, packed[f], false); }));
  }
  const double f32 = median(f32_us);
  double q4_1 = 0;
  std::string line = fmt::format("  ({:>5} x {:>5}) M {:>3}: f32 {:9.1f} us", in, out, M, f32);
  for (std::size_t f = 0; f < packed.size(); ++f) {
    const double t = median(us[f]);
    const quant::TensorType type = packed[f].type;
    if (type == quant::TensorType::Q4_1) q4_1 = t;
    line += fmt::format("  {} {:8.1f} us ({:.2f}x", packed[f].format().name, t, f32 / t);
    if (type == quant::TensorType::Q5_0 || type == quant::TensorType::Q4_K || type == quant::TensorType::Q6_K)
      line += fmt::format(", q4_1 {:.2f}x", q4_1 / t);
    line += ")";
  }
  fmt::print("{}\n", line);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, formats = "f32,file,q8_0,bf16", threads = "1,2", kernels = "yes";
  std::size_t tokens = 128;
  int repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--model") model_path = argv[i + 1];
    else if (arg == "--weights") formats = argv[i + 1];
    else if (arg == "--threads") threads = argv[i + 1];
    else if (arg == "--tokens") tokens = std::stoul(argv[i + 1]);
    else if (arg == "--repeats") repeats = std::stoi(argv[i + 1]);
    else if (arg == "--kernels") kernels = argv[i + 1];
    else {
      fmt::print(stderr, "usage: bench_packed [--model FILE] [--weights f32,file,...] [--threads 1,2] [--tokens N] "
                         "[--repeats N] [--kernels yes|no]\n");
      return 2;
    }
  }
  fmt::print("bench_packed: SIMD level {}\n", simd_level_name(simd_level()));
  set_num_threads(1);
  if (kernels == "yes") {
    fmt::print("M rows times a matrix, one thread, median of {} (ratios: float32's time over the format's):\n", repeats);
    for (std::size_t M : {1, 4, 16, 128, 512})
      for (auto [in, out] : {std::pair<std::size_t, std::size_t>{576, 576}, {576, 1536}, {1536, 576}, {576, 49152}})
        if (M <= 16 || out < 49152) kernel_products(in, out, M, repeats);
  }
  if (model_path.empty()) return 0;
  for (const std::string& format : split(formats)) {
    const auto start = std::chrono::steady_clock::now();
    nn::PretrainedModel loaded = nn::load_pretrained(model_path, {.weights = format});
    const double load = seconds_since(start);
    loaded.model.set_training(false);
    for (const std::string& t : split(threads)) {
      set_num_threads(std::stoi(t));
      std::vector<double> rates;
      for (int r = 0; r < repeats; ++r) rates.push_back(decode_rate(loaded.model, tokens));
      std::sort(rates.begin(), rates.end());
      fmt::print("tg{} {:>5} threads {}: {:7.1f} tokens/s (min {:.1f}, max {:.1f}; load {:.2f} s)\n", tokens, format,
                 t, median(rates), rates.front(), rates.back(), load);
    }
  }
  return 0;
}
