// generate over the KV cache of every architecture: cached and uncached alike, batches whose
// samples are what each seed gives alone, live weights, max_len and bad prompts, models with only
// a forward, and the seed model's greedy text at every SIMD level.
#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "core/ops.h"
#include "core/simd.h"
#include "nn/generate.h"
#include "nn/language_model.h"
#include "nn/models/gpt2.h"
#include "nn/models/llama.h"
#include "nn/models/rotary_decoder.h"
#include "support/checks.h"
#include "support/small_models.h"

using namespace tapegrad;
using namespace tapegrad::nn;
using test::random_ids;
using test::sharpen;
using test::small_model;

TEST_CASE_TEMPLATE("cached and uncached generate give identical tokens, greedy and sampled", M, RotaryDecoder, Gpt2) {
  M model = small_model<M>(40);
  sharpen(model, 7);
  std::vector<std::int32_t> prompt = {1, 2, 3};
  for (float temperature : {0.0f, 0.8f, 1.5f}) {
    GenerateOptions options{.max_new = 30, .sampling = {.temperature = temperature, .top_k = 8, .top_p = 0.95f}, .seed = 11};
    Generation cached = generate(model, prompt, options);
    options.use_cache = false;
    Generation uncached = generate(model, prompt, options);
    CHECK(cached.tokens.size() == 30);
    CHECK(cached.tokens == uncached.tokens);
  }
}

TEST_CASE_TEMPLATE("sample i of a batch is the text that seed S+i gives alone, greedy and sampled", M, RotaryDecoder,
                   Gpt2) {
  M model = small_model<M>(48);
  sharpen(model, 8);
  std::vector<std::int32_t> prompt = {4, 5, 6};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (float temperature : {0.0f, 1.0f}) {
      CAPTURE(threads);
      CAPTURE(temperature);
      GenerateOptions options{.max_new = 40, .sampling = {.temperature = temperature}, .seed = 100};
      std::vector<std::pair<std::size_t, std::int32_t>> seen;
      auto batch = generate_samples(model, prompt, 6, options,
                                    [&](std::size_t i, std::int32_t token) { seen.emplace_back(i, token); });
      REQUIRE(batch.size() == 6);
      CHECK(seen.size() == 6 * 40);
      std::set<std::vector<std::int32_t>> distinct;
      for (std::size_t i = 0; i < 6; ++i) {
        GenerateOptions alone = options;
        alone.seed = 100 + i;
        CHECK(batch[i].tokens == generate(model, prompt, alone).tokens);
        distinct.insert(batch[i].tokens);
      }
      CHECK(distinct.size() == (temperature == 0 ? 1u : 6u));  // greedy samples agree; drawn ones differ
    }
  }
  set_num_threads(0);
}

TEST_CASE("generate reads the weights live: after an update it follows the new weights") {
  RotaryDecoder model = rotary_decoder(13, 16, 2, 2, 40);
  sharpen(model, 8);
  std::vector<std::int32_t> prompt = {4, 5};
  GenerateOptions greedy{.max_new = 20, .sampling = {.temperature = 0.0f}};
  Generation before = generate(model, prompt, greedy);
  // A plain SGD step on the loss of some text changes every parameter in place.
  auto ids = random_ids(17, 13, 9);
  {
    Tape tape;
    tape.backward(model.loss(std::span(ids).first(16), std::span(ids).subspan(1), 1, 16));
  }
  for (auto& p : model.params()) {
    Tensor& v = p.var.mutable_value();
    for (std::size_t i = 0; i < v.size(); ++i) v[i] -= 5.0f * p.var.grad()[i];
  }
  Generation after = generate(model, prompt, greedy);
  GenerateOptions no_cache = greedy;
  no_cache.use_cache = false;
  CHECK(after.tokens == generate(model, prompt, no_cache).tokens);
  CHECK(after.tokens != before.tokens);
}

TEST_CASE("generate stops at max_len and says so, and refuses bad prompts") {
  RotaryDecoder model = rotary_decoder(13, 16, 2, 1, 10);
  std::vector<std::int32_t> prompt = {1, 2, 3, 4};
  Generation g = generate(model, prompt, {.max_new = 50});
  CHECK(g.tokens.size() == 6);
  CHECK(g.stopped_at_max_len);
  CHECK_FALSE(generate(model, prompt, {.max_new = 6}).stopped_at_max_len);
  CHECK(test::error_of([&] { generate(model, std::vector<std::int32_t>{}, {}); }) ==
        "generate: the prompt is empty; give at least one token");
  CHECK(test::error_of([&] { generate(model, std::vector<std::int32_t>(11, 1), {}); }) ==
        "generate: the prompt has 11 tokens, longer than max_len 10");
  CHECK(test::contains(test::error_of([&] { generate(model, std::vector<std::int32_t>{1, 13}, {}); }), "id 13"));
  CHECK(test::error_of([&] { generate_samples(model, prompt, 0, {}); }) ==
        "generate: the number of samples must be at least 1");
  // Too many sequences for a cache: one clear error before anything is allocated.
  const std::size_t too_many = std::size_t(1) << 40;
  CHECK(test::contains(test::error_of([&] { generate_samples(model, prompt, too_many, {}); }),
                       "KVCache: 1099511627776 sequences x 1 layers x 10 positions x 16 floats is more than the "
                       "supported 1073741824 floats (4 GiB) for the keys; decode fewer sequences at once"));
}

namespace {
// A model with only a forward: generate must fall back to the full forward for every token.
struct ForwardOnly {
  const RotaryDecoder& inner;
  Var forward(std::span<const std::int32_t> ids, std::size_t b, std::size_t t) const { return inner.forward(ids, b, t); }
  const RotaryDecoderConfig& config() const { return inner.config(); }
};
static_assert(ForwardModel<ForwardOnly> && !CachedModel<ForwardOnly>);
static_assert(CachedModel<RotaryDecoder> && CachedModel<Gpt2> && CachedModel<LanguageModel>);
}  // namespace

TEST_CASE("generate is generic: a model with only forward decodes the same tokens, one sample or many") {
  RotaryDecoder model = rotary_decoder(13, 16, 2, 1, 30);
  sharpen(model, 10);
  std::vector<std::int32_t> prompt = {3};
  GenerateOptions options{.max_new = 12, .sampling = {.temperature = 1.0f}, .seed = 5};
  CHECK(generate(ForwardOnly{model}, prompt, options).tokens == generate(model, prompt, options).tokens);
  auto a = generate_samples(ForwardOnly{model}, prompt, 3, options), b = generate_samples(model, prompt, 3, options);
  for (std::size_t i = 0; i < 3; ++i) CHECK(a[i].tokens == b[i].tokens);
}

TEST_CASE("the seed model decodes the same greedy text at every SIMD level, with and without the cache") {
  RotaryDecoder model = rotary_decoder(65, 64, 4, 2, 256);  // the seed benchmark's model
  sharpen(model, 11);
  std::vector<std::int32_t> prompt = random_ids(8, 65, 12);
  GenerateOptions greedy{.max_new = 100, .sampling = {.temperature = 0.0f}};
  GenerateOptions no_cache = greedy;
  no_cache.use_cache = false;
  // Without the cache only at the suite's own level: the suite runs once per level, and the
  // uncached decoding (a whole forward pass per token) was most of this test's time at each.
  const auto cached = generate(model, prompt, greedy).tokens;
  CHECK(cached == generate(model, prompt, no_cache).tokens);
  SimdLevel saved = simd_level();
  for (SimdLevel level : testable_simd_levels()) {
    CAPTURE(simd_level_name(level));
    set_simd_level(level);
    CHECK(generate(model, prompt, greedy).tokens == cached);
  }
  set_simd_level(saved);
}
