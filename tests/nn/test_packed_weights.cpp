// Packed weights (nn/packed_weights.h, LoadOptions::weights): the tiny Llama's GGUF files decoded
// from their own blocks or converted at load, against the same file dequantized to float32; a
// sequence gets the same bits alone as beside another; the full forward refuses packed weights.
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <vector>

#include "core/threads.h"
#include "nn/linear.h"
#include "nn/packed_weights.h"
#include "nn/pretrained.h"

using namespace tapegrad;

namespace {

std::string tiny_llama(const std::string& format) {
  return (std::filesystem::path(TAPEGRAD_SOURCE_DIR) / "tests/data/models/tiny_llama" /
          fmt::format("tiny_llama.{}.gguf", format))
      .string();
}

const std::vector<std::int32_t> prompt = {1, 17, 42, 99, 7, 250, 3, 64, 128, 5};

std::vector<float> prefill_logits(const nn::LanguageModel& model, std::span<const std::int32_t> tokens) {
  nn::KVCache cache = model.make_cache(1, 32);
  const Tensor logits = model.prefill(tokens, cache);
  return {logits.data(), logits.data() + logits.size()};
}

}  // namespace

TEST_CASE("a GGUF file's own blocks decode within the activation rounding of its dequantized float32 weights") {
  for (const char* format : {"q4_0", "q4_1", "q8_0", "bf16", "f16", "f32"}) {
    CAPTURE(format);
    nn::PretrainedModel dense = nn::load_pretrained(tiny_llama(format));
    nn::PretrainedModel packed = nn::load_pretrained(tiny_llama(format), {.weights = "file"});
    CHECK(nn::has_packed_matrices(packed.model.module()));
    CHECK_FALSE(nn::has_packed_matrices(dense.model.module()));
    const std::vector<float> expected = prefill_logits(dense.model, prompt), got = prefill_logits(packed.model, prompt);
    REQUIRE(got.size() == expected.size());
    double max_diff = 0, max_logit = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(double(got[i]) - expected[i]));
      max_logit = std::max(max_logit, std::fabs(double(expected[i])));
    }
    // F16 and F32 weights are exact in float32 (only the order of the sums differs); BF16's
    // products round the activations to bf16 (8 bits of mantissa: 0.7% here), the block formats
    // quantize each block of them to 8 bits.
    const bool blocks = format[0] == 'q', bf16 = std::string_view(format) == "bf16";
    CHECK_MESSAGE(max_diff <= (blocks ? 0.03 : bf16 ? 0.015 : 1e-4) * max_logit,
                  fmt::format("{}: logits differ by up to {} (largest {})", format, max_diff, max_logit));
  }
}

// The largest difference between two models' logits, and the largest logit of the second.
std::pair<double, double> logit_gap(const std::vector<float>& got, const std::vector<float>& expected) {
  double max_diff = 0, max_logit = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - expected[i]));
    max_logit = std::max(max_logit, std::fabs(double(expected[i])));
  }
  return {max_diff, max_logit};
}

TEST_CASE("weights converted at load decode as the gguf package's files of the same float32 weights") {
  nn::PretrainedModel dense = nn::load_pretrained(tiny_llama("f32"));
  for (const char* weights : {"bf16", "f16", "q8_0", "q4_0", "q4_1"}) {
    CAPTURE(weights);
    // The committed files were quantized from the same float32 weights by gguf.quants.quantize
    // (the 4-bit ones with token_embd in Q8_0, as load_pretrained converts them).
    nn::PretrainedModel converted = nn::load_pretrained(tiny_llama("f32"), {.weights = weights});
    nn::PretrainedModel file = nn::load_pretrained(tiny_llama(weights), {.weights = "file"});
    CHECK(converted.model.num_params() < dense.model.num_params() / 2);  // the matrices left params()
    const std::vector<float> got = prefill_logits(converted.model, prompt), expected = prefill_logits(file.model, prompt);
    const auto [max_diff, max_logit] = logit_gap(got, expected);
    CHECK_MESSAGE(max_diff <= 1e-3 * max_logit,
                  fmt::format("{}: logits differ from the file's blocks by up to {} (largest {})", weights, max_diff,
                              max_logit));
  }
  CHECK_THROWS_WITH(nn::load_pretrained(tiny_llama("f32"), {.weights = "q5_0"}),
                    doctest::Contains("weights 'q5_0' is not one of f32, file, bf16, f16, q8_0, q4_0, q4_1"));
}

TEST_CASE("a sequence decoded on packed weights gets the same bits alone and beside another") {
  nn::PretrainedModel packed = nn::load_pretrained(tiny_llama("q4_1"), {.weights = "file"});
  const nn::LanguageModel& model = packed.model;
  const std::vector<std::vector<std::int32_t>> prompts = {prompt, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12, 13}};
  nn::KVCache together = model.make_cache(2, 32);
  const Tensor both = model.prefill(prompts, together);
  std::size_t row = 0;
  const std::size_t vocab = model.config().vocab;
  for (std::size_t s = 0; s < prompts.size(); ++s) {
    const std::vector<float> alone = prefill_logits(model, prompts[s]);
    CHECK_MESSAGE(std::memcmp(alone.data(), both.data() + row * vocab, alone.size() * sizeof(float)) == 0,
                  fmt::format("sequence {}'s prefill differs beside the other", s));
    row += prompts[s].size();
    nn::KVCache last_only = model.make_cache(1, 32);
    const Tensor last = model.prefill(prompts[s], last_only, 0, nn::PrefillLogits::last_token);
    CHECK_MESSAGE(std::memcmp(last.data(), both.data() + (row - 1) * vocab, vocab * sizeof(float)) == 0,
                  fmt::format("sequence {}'s last-token prefill differs from its last row", s));
  }
  const std::vector<std::int32_t> next = {31, 200};
  const std::span<const float> stepped = model.step(next, together);  // (2, vocab)
  for (std::size_t s = 0; s < prompts.size(); ++s) {
    nn::KVCache alone = model.make_cache(1, 32);
    model.prefill(prompts[s], alone);
    const std::span<const float> logits = model.step(next[s], alone);
    CHECK_MESSAGE(std::memcmp(logits.data(), stepped.data() + s * vocab, vocab * sizeof(float)) == 0,
                  fmt::format("sequence {}'s step differs beside the other", s));
  }
}

TEST_CASE("sequences decoded on two threads get the same bits in a pass each and in one pass that splits products") {
  // A model whose packed weights stream from memory runs in one pass (run_cache_passes), its
  // attention splitting the sequences over the threads; the tiny Llama's are small, so the cache is
  // told its last pass read more than that.
  nn::PretrainedModel packed = nn::load_pretrained(tiny_llama("q8_0"), {.weights = "file"});
  const nn::LanguageModel& model = packed.model;
  const std::vector<std::vector<std::int32_t>> prompts = {prompt, {9, 8, 7}, {5, 4, 3, 2, 1}, {100, 200}};
  const int threads_before = num_threads();
  set_num_threads(2);
  for (nn::KVCacheType type : {nn::KVCacheType::f32, nn::KVCacheType::f16}) {
    CAPTURE(int(type));
    std::vector<std::vector<float>> logits;
    for (bool streaming : {false, true}) {
      nn::KVCache cache = model.make_cache(prompts.size(), 32, type);
      model.prefill(prompts, cache);
      if (streaming) cache.packed_bytes_per_pass = std::size_t(1) << 40;
      CHECK((cache.packed_bytes_per_pass > 0));  // the prefill counted the packed weights
      const std::vector<std::int32_t> next = {31, 200, 7, 1};
      const std::span<const float> stepped = model.step(next, cache);
      logits.emplace_back(stepped.begin(), stepped.end());
    }
    CHECK(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)) == 0);
  }
  set_num_threads(threads_before);
}

TEST_CASE("the full forward refuses packed weights, naming what to do instead") {
  nn::PretrainedModel packed = nn::load_pretrained(tiny_llama("q8_0"), {.weights = "file"});
  CHECK_THROWS_WITH(packed.model.forward(prompt, 1, prompt.size()),
                    doctest::Contains("packed for inference (nn/packed_weights.h); decode through"));
}
