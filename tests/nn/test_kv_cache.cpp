#include <doctest/doctest.h>

#include "core/ops.h"
#include "core/simd.h"
#include "nn/generate.h"
#include "nn/rotary_decoder.h"
#include "support/checks.h"

using namespace tapegrad;
using namespace tapegrad::nn;
using test::random_ids;

namespace {

// Scales every matrix up so that logits are far from uniform and differences show.
void sharpen(RotaryDecoder& model, std::uint64_t seed) {
  Rng rng(seed);
  for (auto& p : model.params())
    if (p.var.shape().size() == 2) rng.fill_normal(p.var.mutable_value(), 0.3f);
}

Tensor full_forward(const RotaryDecoder& model, std::span<const std::int32_t> ids) {
  NoGradScope no_grad;
  return model.forward(ids, 1, ids.size()).value();
}
}  // namespace

TEST_CASE("step logits equal the full forward's row at every position") {
  struct Shape5 { std::size_t heads, blocks; std::optional<std::size_t> d_ff; };
  for (auto [heads, blocks, d_ff] : {Shape5{1, 1, std::nullopt}, {4, 1, 24}, {1, 3, 40}, {4, 3, std::nullopt}}) {
    CAPTURE(heads);
    CAPTURE(blocks);
    RotaryDecoder model = rotary_decoder(13, 16, heads, blocks, 70, d_ff);
    sharpen(model, 1);
    auto ids = random_ids(70, 13, 2);  // crosses the attention kernel's 64-row block
    Tensor full = full_forward(model, ids);
    KVCache cache = model.make_cache();
    // The step runs the one-query attention kernel and the full forward the tiled online softmax:
    // float rounding in different orders, so the bound is relative to max(1, |logit|).
    float worst = 0;
    for (std::size_t t = 0; t < ids.size(); ++t) {
      auto logits = model.step(ids[t], cache);
      for (std::size_t v = 0; v < 13; ++v)
        worst = std::max(worst, std::fabs(logits[v] - full[t * 13 + v]) / std::max(1.0f, std::fabs(full[t * 13 + v])));
    }
    CHECK(worst <= 1e-5f);
  }
}

TEST_CASE("prefill then step equals token-by-token stepping") {
  RotaryDecoder model = rotary_decoder(13, 16, 2, 2, 32);
  sharpen(model, 3);
  auto ids = random_ids(20, 13, 4);
  KVCache a = model.make_cache(), b = model.make_cache();
  Tensor prefilled = model.prefill(std::span(ids).first(12), a);
  CHECK(prefilled.shape() == Shape{12, 13});
  std::vector<float> stepped;
  for (std::size_t t = 0; t < 12; ++t) {
    auto l = model.step(ids[t], b);
    stepped.assign(l.begin(), l.end());
    for (std::size_t v = 0; v < 13; ++v) CHECK(prefilled[t * 13 + v] == doctest::Approx(l[v]).epsilon(1e-5).scale(1));
  }
  CHECK(a.position() == 12);
  for (std::size_t t = 12; t < 20; ++t) {
    auto la = model.step(ids[t], a);
    std::vector<float> va(la.begin(), la.end());
    auto lb = model.step(ids[t], b);
    for (std::size_t v = 0; v < 13; ++v) CHECK(va[v] == doctest::Approx(lb[v]).epsilon(1e-5).scale(1));
  }
}

TEST_CASE("reset gives the same outputs as a fresh cache; running past max_len is a clear error") {
  RotaryDecoder model = rotary_decoder(13, 16, 2, 2, 8);
  sharpen(model, 5);
  auto ids = random_ids(8, 13, 6);
  KVCache cache = model.make_cache();
  model.prefill(std::span(ids).first(5), cache);
  cache.reset();
  CHECK(cache.position() == 0);
  std::vector<float> after_reset;  // every step's logits, in order
  for (auto id : ids) {
    auto l = model.step(id, cache);
    after_reset.insert(after_reset.end(), l.begin(), l.end());
  }
  KVCache fresh = model.make_cache();
  std::vector<float> from_fresh;
  for (auto id : ids) {
    auto l = model.step(id, fresh);
    from_fresh.insert(from_fresh.end(), l.begin(), l.end());
  }
  CHECK(after_reset.size() == ids.size() * 13);
  CHECK(after_reset == from_fresh);
  CHECK(test::error_of([&] { model.step(1, cache); }) ==
        "KVCache: 1 tokens at position 8 run past max_len 8; reset() to start a new sequence");
  cache.reset();
  CHECK(test::contains(test::error_of([&] { model.step(13, cache); }), "token id 13 at index 0 is outside the vocabulary of size 13"));
  CHECK(test::contains(test::error_of([&] { model.prefill(std::span<const std::int32_t>{}, cache); }), "no tokens"));
}

TEST_CASE("a cache filled before the weights changed is refused") {
  RotaryDecoder model = rotary_decoder(13, 16, 2, 1, 16);
  KVCache cache = model.make_cache();
  model.step(1, cache);
  model.step(2, cache);
  model.head.bias.mutable_value()[0] += 1.0f;  // an in-place update, as an optimizer makes
  CHECK(test::contains(test::error_of([&] { model.step(3, cache); }),
                       "the weights changed since this cache was filled (version"));
  cache.reset();
  CHECK_NOTHROW(model.step(3, cache));
  RotaryDecoder other = rotary_decoder(13, 16, 2, 2, 16);
  CHECK(test::contains(test::error_of([&] { other.step(1, cache); }), "made for 1 blocks x 16 positions"));
}

TEST_CASE("a step does not allocate after the first") {
  RotaryDecoder model = rotary_decoder(13, 16, 2, 1, 64);
  KVCache cache = model.make_cache();
  const float* first = model.step(1, cache).data();
  for (std::int32_t t = 0; t < 60; ++t) CHECK(model.step(t % 13, cache).data() == first);
}

TEST_CASE("cached and uncached generate give identical tokens, greedy and sampled") {
  RotaryDecoder model = rotary_decoder(13, 16, 2, 2, 40);
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
}

namespace {
// A model with only a forward: generate must fall back to the full forward for every token.
struct ForwardOnly {
  const RotaryDecoder& inner;
  Var forward(std::span<const std::int32_t> ids, std::size_t b, std::size_t t) const { return inner.forward(ids, b, t); }
  const DecoderConfig& config() const { return inner.config(); }
};
static_assert(ForwardModel<ForwardOnly> && !CachedModel<ForwardOnly>);
static_assert(CachedModel<RotaryDecoder>);
}  // namespace

TEST_CASE("generate is generic: a model with only forward decodes the same tokens") {
  RotaryDecoder model = rotary_decoder(13, 16, 2, 1, 30);
  sharpen(model, 10);
  std::vector<std::int32_t> prompt = {3};
  GenerateOptions options{.max_new = 12, .sampling = {.temperature = 1.0f}, .seed = 5};
  CHECK(generate(ForwardOnly{model}, prompt, options).tokens == generate(model, prompt, options).tokens);
}

TEST_CASE("the seed model decodes the same greedy text at every SIMD level, with and without the cache") {
  RotaryDecoder model = rotary_decoder(65, 64, 4, 2, 256);  // the seed benchmark's model
  sharpen(model, 11);
  std::vector<std::int32_t> prompt = random_ids(8, 65, 12);
  GenerateOptions greedy{.max_new = 100, .sampling = {.temperature = 0.0f}};
  GenerateOptions no_cache = greedy;
  no_cache.use_cache = false;
  SimdLevel saved = simd_level();
  std::vector<std::int32_t> reference;
  for (SimdLevel level : supported_simd_levels()) {
    CAPTURE(simd_level_name(level));
    set_simd_level(level);
    auto cached = generate(model, prompt, greedy).tokens;
    CHECK(cached == generate(model, prompt, no_cache).tokens);
    if (reference.empty()) reference = cached;
    CHECK(cached == reference);
  }
  set_simd_level(saved);
}
