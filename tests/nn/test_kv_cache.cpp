// The KV cache of every architecture, one sequence and many: cached logits against the full
// forward, batched against single-sequence decoding, drop and restart, stale weights, and a step
// that allocates nothing (generate over it: test_generate.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <set>

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
using test::grouped_llama;

// The replacements below pair malloc with free; GCC cannot see that once it inlines the standard
// allocator, and warns.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

// Counts the heap allocations of every thread while `counting` is set: a step must make none.
namespace {
std::atomic<bool> counting = false;
std::atomic<std::size_t> allocations = 0;
// Every form is replaced, so that each allocation and its release meet in malloc (or
// posix_memalign, for the aligned forms the cache's buffers use) and free (a sanitizer's own forms
// would otherwise pair with these and report a mismatch).
void* counted_malloc(std::size_t n) noexcept {
  if (counting) ++allocations;
  return std::malloc(n ? n : 1);
}
void* counted_aligned(std::size_t n, std::align_val_t alignment) noexcept {
  if (counting) ++allocations;
  void* p = nullptr;
  return posix_memalign(&p, std::max(std::size_t(alignment), sizeof(void*)), n ? n : 1) == 0 ? p : nullptr;
}
}  // namespace
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = counted_aligned(n, a)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
  if (void* p = counted_aligned(n, a)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return counted_aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_aligned(n, a);
}
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void* operator new(std::size_t n) {
  if (void* p = counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted_malloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_malloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_malloc(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

std::span<const float> all(const Tensor& t) { return {t.data(), t.size()}; }

template <class M>
Tensor full_forward(const M& model, std::span<const std::int32_t> ids) {
  NoGradScope no_grad;
  return model.forward(ids, 1, ids.size()).value();
}

// The worst |a - b| / max(1, |b|) over rows of logits. A cache pass runs the row-stable matmul
// and the one-query attention, the full forward BLAS and the tiled online softmax: float rounding
// in different orders.
float worst_relative(std::span<const float> a, std::span<const float> b) {
  float worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0f, std::fabs(b[i])));
  return worst;
}

}  // namespace

TEST_CASE_TEMPLATE("cached logits equal the full forward's row at every position, 1 and 5 sequences", M, RotaryDecoder,
                   Gpt2, Llama) {
  const std::vector<std::size_t> lengths = {1, 3, 8, 64, 65};  // across the attention kernel's 64-row block
  M model = small_model<M>(80);
  sharpen(model, 1);
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::size_t i = 0; i < lengths.size(); ++i) prompts.push_back(random_ids(lengths[i] + 4, 13, 20 + i));
  // Tolerance: 1e-5 relative to max(1, |logit|) (float rounding in different orders, above).
  SUBCASE("one sequence: prefill the first part, then step token by token") {
    for (const auto& ids : prompts) {
      CAPTURE(ids.size());
      Tensor full = full_forward(model, ids);
      KVCache cache = model.make_cache();
      const std::size_t split = ids.size() - 4;
      Tensor prefilled = model.prefill(std::span(ids).first(split), cache);
      CHECK(prefilled.shape() == Shape{split, 13});
      CHECK(worst_relative(all(prefilled), all(full).first(split * 13)) <= 1e-5f);
      for (std::size_t t = split; t < ids.size(); ++t)
        CHECK(worst_relative(model.step(ids[t], cache), all(full).subspan(t * 13, 13)) <= 1e-5f);
      CHECK(cache.position() == ids.size());
    }
  }
  SUBCASE("five sequences of different lengths: one prefill pass, then steps of all five") {
    KVCache cache = model.make_cache(5);
    std::vector<std::vector<std::int32_t>> heads;
    for (const auto& ids : prompts) heads.emplace_back(ids.begin(), ids.end() - 4);
    Tensor prefilled = model.prefill(heads, cache);
    std::size_t row = 0;
    for (std::size_t s = 0; s < 5; ++s) {
      CAPTURE(s);
      Tensor full = full_forward(model, prompts[s]);
      CHECK(worst_relative(all(prefilled).subspan(row * 13, lengths[s] * 13), all(full).first(lengths[s] * 13)) <=
            1e-5f);
      row += lengths[s];
      CHECK(cache.position(s) == lengths[s]);
    }
    for (std::size_t t = 0; t < 4; ++t) {
      std::vector<std::int32_t> tokens;
      for (std::size_t s = 0; s < 5; ++s) tokens.push_back(prompts[s][lengths[s] + t]);
      std::span<const float> logits = model.step(tokens, cache);
      REQUIRE(logits.size() == 5 * 13);
      for (std::size_t s = 0; s < 5; ++s) {
        Tensor full = full_forward(model, prompts[s]);
        CHECK(worst_relative(logits.subspan(s * 13, 13), all(full).subspan((lengths[s] + t) * 13, 13)) <= 1e-5f);
      }
    }
  }
}

namespace {

// Sizes whose rows end in a partial vector: 24, 40, 72 and 100 at 16 lanes (100 at 8 too), and
// 30, 18, 50 and 102 at every width (head sizes 10 and 6); 2-5 heads; and the test model's sizes.
struct ModelSize {
  std::size_t d_model, heads, d_ff;
};
constexpr ModelSize odd_shapes[] = {{16, 2, 40}, {24, 3, 72}, {40, 5, 100}, {48, 4, 24},
                                    {48, 3, 100}, {16, 2, 24}, {30, 3, 50}, {18, 3, 102}};

// Llama: as many heads, on one KV head (every query head shares it).
template <class M>
M shaped_model(const ModelSize& shape, std::size_t max_len) {
  if constexpr (std::is_same_v<M, Gpt2>) return gpt2(13, shape.d_model, shape.heads, 2, max_len, shape.d_ff);
  else if constexpr (std::is_same_v<M, Llama>)
    return grouped_llama(shape.d_model, shape.heads, 1, 2, max_len, shape.d_ff);
  else return rotary_decoder(13, shape.d_model, shape.heads, 2, max_len, shape.d_ff);
}

// Prefills each prompt, then 6 steps of the tokens `next` (6 per sequence), alone (a cache each,
// one thread) and all together on 1 and 2 threads, and checks each sequence's logits bit for bit.
template <class M>
void check_batched_equals_alone(const M& model, const std::vector<std::vector<std::int32_t>>& prompts,
                                const std::vector<std::int32_t>& next, KVCacheType type = KVCacheType::f32) {
  const std::size_t S = prompts.size();
  set_num_threads(1);
  std::vector<std::vector<float>> alone(S);
  for (std::size_t s = 0; s < S; ++s) {
    KVCache cache = model.make_cache(1, 0, type);
    Tensor p = model.prefill(prompts[s], cache);
    alone[s].assign(all(p).begin() + (prompts[s].size() - 1) * 13, all(p).end());
    for (std::size_t t = 0; t < 6; ++t) {
      auto l = model.step(next[t * S + s], cache);
      alone[s].insert(alone[s].end(), l.begin(), l.end());
    }
  }
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    KVCache cache = model.make_cache(S, 0, type);
    Tensor p = model.prefill(prompts, cache);
    std::vector<std::vector<float>> batched(S);
    std::size_t end = 0;
    for (std::size_t s = 0; s < S; ++s) {
      end += prompts[s].size();
      batched[s].assign(all(p).begin() + (end - 1) * 13, all(p).begin() + end * 13);
    }
    for (std::size_t t = 0; t < 6; ++t) {
      auto l = model.step(std::span(next).subspan(t * S, S), cache);
      for (std::size_t s = 0; s < S; ++s) batched[s].insert(batched[s].end(), l.begin() + s * 13, l.begin() + (s + 1) * 13);
    }
    for (std::size_t s = 0; s < S; ++s) {
      CAPTURE(s);
      CHECK(batched[s] == alone[s]);  // bit for bit
    }
  }
  set_num_threads(0);
}

}  // namespace

TEST_CASE_TEMPLATE("batched decoding gives every sequence the bits it gets alone, on 1 and 2 threads", M, RotaryDecoder,
                   Gpt2, Llama) {
  M model = small_model<M>(90);
  sharpen(model, 2);
  const std::vector<std::size_t> lengths = {1, 3, 8, 64, 65, 7, 2};
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::size_t i = 0; i < lengths.size(); ++i) prompts.push_back(random_ids(lengths[i], 13, 40 + i));
  check_batched_equals_alone(model, prompts, random_ids(lengths.size() * 6, 13, 50));
}

TEST_CASE_TEMPLATE("a 16-bit cache gives every sequence the bits it gets alone, and logits near a float cache's", M,
                   RotaryDecoder, Gpt2, Llama) {
  M model = small_model<M>(90);
  sharpen(model, 2);
  const std::vector<std::size_t> lengths = {1, 3, 8, 64, 65, 7, 2};
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::size_t i = 0; i < lengths.size(); ++i) prompts.push_back(random_ids(lengths[i], 13, 40 + i));
  check_batched_equals_alone(model, prompts, random_ids(lengths.size() * 6, 13, 50), KVCacheType::f16);

  KVCache floats = model.make_cache(1, 0, KVCacheType::f32), halves = model.make_cache(1, 0, KVCacheType::f16);
  CHECK(halves.type() == KVCacheType::f16);
  const Tensor want = model.prefill(prompts[4], floats), got = model.prefill(prompts[4], halves);
  float largest = 0;
  for (std::size_t i = 0; i < want.size(); ++i) largest = std::max(largest, std::fabs(got.data()[i] - want.data()[i]));
  CHECK(largest > 0);  // the cache's values are rounded: the keys and values of 65 positions
  CHECK(largest < 2e-2f);
  CHECK_THROWS_WITH_AS(halves.keys<float>(0, 0), "KVCache: the cache's values read as another type than they are held",
                       std::logic_error);
}

TEST_CASE_TEMPLATE("a prefill of the last tokens' logits gives each prompt's last row bit for bit, then the same steps", M,
                   RotaryDecoder, Gpt2, Llama) {
  M model = small_model<M>(90);
  sharpen(model, 2);
  const std::vector<std::size_t> lengths = {1, 3, 8, 65, 7};
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::size_t i = 0; i < lengths.size(); ++i) prompts.push_back(random_ids(lengths[i], 13, 60 + i));
  prompts.insert(prompts.begin() + 2, std::vector<std::int32_t>{});  // no row for an empty prompt
  const std::vector<std::int32_t> next = random_ids(prompts.size(), 13, 61);
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    KVCache every = model.make_cache(prompts.size()), last = model.make_cache(prompts.size());
    const Tensor all_rows = model.prefill(prompts, every);
    const Tensor last_rows = model.prefill(prompts, last, PrefillLogits::last_token);
    REQUIRE(last_rows.shape() == Shape{lengths.size(), 13});
    std::size_t end = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      CAPTURE(i);
      end += lengths[i];
      CHECK(std::equal(all(last_rows).begin() + i * 13, all(last_rows).begin() + (i + 1) * 13,
                       all(all_rows).begin() + (end - 1) * 13));
    }
    every.drop(2), last.drop(2);
    const std::span<const float> after_every = model.step(next, every), after_last = model.step(next, last);
    CHECK(std::memcmp(after_every.data(), after_last.data(), after_every.size_bytes()) == 0);  // NaN rows too
  }
  set_num_threads(0);
  KVCache one = model.make_cache();
  CHECK(model.prefill(prompts[1], one, 0, PrefillLogits::last_token).shape() == Shape{1, 13});
}

TEST_CASE("one sequence decodes to the same bits on 1 and 2 threads where its matrix products split across them") {
  // 256 x 1024 weights: row_stable_matmul splits from 2^16 (a prefill of 9 rows and steps of one).
  Llama model = grouped_llama(256, 8, 2, 2, 32, 1024);
  sharpen(model, 1024);
  check_batched_equals_alone(model, {random_ids(9, 13, 70)}, random_ids(6, 13, 71));
}

TEST_CASE("one sequence's attention split by heads over 2 threads gives the bits of 1 thread, and of a batch") {
  // 6 heads on 3 KV heads: 2 threads take heads 0-2 and 3-5, splitting KV head 1's group. A prompt
  // of 175 tokens and steps after it are past the work from which attention splits.
  Llama model = grouped_llama(192, 6, 3, 1, 200, 64);
  sharpen(model, 176);
  REQUIRE(176 * 192 >= CachePass::min_split_attention);  // the first step: 176 keys of 192 floats
  check_batched_equals_alone(model, {random_ids(175, 13, 72)}, random_ids(6, 13, 73));
  check_batched_equals_alone(model, {random_ids(175, 13, 72), random_ids(4, 13, 74)}, random_ids(12, 13, 75));
}

TEST_CASE_TEMPLATE("batched decoding is bit for bit at sizes no SIMD width divides, prompts of 1 to 17 tokens", M,
                   RotaryDecoder, Gpt2, Llama) {
  for (const ModelSize& shape : odd_shapes) {
    CAPTURE(shape.d_model);
    CAPTURE(shape.heads);
    CAPTURE(shape.d_ff);
    M model = shaped_model<M>(shape, 32);
    sharpen(model, shape.d_ff);
    std::vector<std::vector<std::int32_t>> prompts;
    for (std::size_t length = 1; length <= 17; ++length) prompts.push_back(random_ids(length, 13, 60 + length));
    check_batched_equals_alone(model, prompts, random_ids(prompts.size() * 6, 13, shape.d_model));
  }
}

TEST_CASE_TEMPLATE("dropping or restarting a sequence leaves the others' logits unchanged", M, RotaryDecoder, Gpt2) {
  for (const ModelSize& shape : odd_shapes) {
    CAPTURE(shape.d_model);
    CAPTURE(shape.heads);
    CAPTURE(shape.d_ff);
    M model = shaped_model<M>(shape, 40);
    sharpen(model, 3);
    auto prompt = [](std::uint64_t seed) { return random_ids(5, 13, seed); };
    std::vector<std::vector<std::int32_t>> prompts = {prompt(1), prompt(2), prompt(3)};
    auto tokens = random_ids(30, 13, 4);
    // Reference: the three sequences stepped together, undisturbed.
    KVCache ref = model.make_cache(3), cache = model.make_cache(3);
    model.prefill(prompts, ref);
    model.prefill(prompts, cache);
    std::vector<float> ref_rows;
    for (std::size_t t = 0; t < 10; ++t) {
      auto l = model.step(std::span(tokens).subspan(3 * t, 3), ref);
      ref_rows.assign(l.begin(), l.end());
      if (t == 2) cache.drop(1);
      if (t == 5) {
        cache.restart(1);
        model.prefill(std::span(prompts[1]).first(2), cache, 1);
      }
      auto c = model.step(std::span(tokens).subspan(3 * t, 3), cache);
      CHECK(std::equal(c.begin(), c.begin() + 13, ref_rows.begin()));            // sequence 0
      CHECK(std::equal(c.begin() + 26, c.begin() + 39, ref_rows.begin() + 26));  // sequence 2
      if (t >= 2 && t < 5) CHECK(std::isnan(c[13]));                               // dropped: NaN row
      CHECK(cache.active(1) == !(t >= 2 && t < 5));
    }
    CHECK(cache.position(0) == 15);
    CHECK(cache.position(1) == 2 + 5);  // restarted, 2 prompt tokens, then steps 5..9
    CHECK(test::contains(test::error_of([&] {
      cache.drop(2);
      model.prefill(prompts[2], cache, 2);
    }), "sequence 2 was dropped; restart(2) it first"));
    cache.drop(0);
    cache.drop(1);
    CHECK(test::error_of([&] { model.step(std::span(tokens).first(3), cache); }) ==
          "step: every sequence of the cache has been dropped");
  }
}

TEST_CASE_TEMPLATE("reset gives the same outputs as a fresh cache; past max_len and bad tokens are clear errors", M,
                   RotaryDecoder, Gpt2) {
  M model = small_model<M>(8);
  sharpen(model, 5);
  auto ids = random_ids(8, 13, 6);
  KVCache cache = model.make_cache();
  model.prefill(std::span(ids).first(5), cache);
  cache.reset();
  CHECK(cache.position() == 0);
  std::vector<float> after_reset, from_fresh;  // every step's logits, in order
  for (auto id : ids) {
    auto l = model.step(id, cache);
    after_reset.insert(after_reset.end(), l.begin(), l.end());
  }
  KVCache fresh = model.make_cache();
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
  CHECK(test::error_of([&] { model.step(std::vector<std::int32_t>{1, 2}, cache); }) ==
        "step: 2 tokens for a cache of 1 sequences");
  CHECK(test::contains(test::error_of([&] { model.prefill(ids, cache, 3); }), "sequence 3 of a cache of 1"));
}

TEST_CASE_TEMPLATE("a cache filled before the weights changed is refused; a cache of another model too", M,
                   RotaryDecoder, Gpt2) {
  M model = small_model<M>(16, 1, std::nullopt);
  KVCache cache = model.make_cache(2);
  model.step(std::vector<std::int32_t>{1, 2}, cache);
  model.params().back().var.mutable_value()[0] += 1.0f;  // an in-place update, as an optimizer makes
  CHECK(test::contains(test::error_of([&] { model.step(std::vector<std::int32_t>{3, 4}, cache); }),
                       "the weights changed since this cache was filled (version"));
  cache.restart(0);  // sequence 1 still holds rows of the old weights
  CHECK(test::contains(test::error_of([&] { model.step(std::vector<std::int32_t>{3, 4}, cache); }),
                       "the weights changed"));
  cache.reset();
  CHECK_NOTHROW(model.step(std::vector<std::int32_t>{3, 4}, cache));
  M bigger = small_model<M>(16, 2, std::nullopt);
  CHECK(test::contains(test::error_of([&] { bigger.step(std::vector<std::int32_t>{1, 1}, cache); }),
                       "made for 1 blocks x 16 positions"));
  M twin = small_model<M>(16, 1, std::nullopt);
  CHECK(test::contains(test::error_of([&] { twin.step(std::vector<std::int32_t>{1, 1}, cache); }),
                       "this cache was made by another model"));
}

TEST_CASE("a cache whose rows hold another count of KV heads is refused, by the cache and by the pass") {
  CHECK(test::error_of([] { KVCache(1, 8, 10, 1, 3); }) == "KVCache: rows of 10 values do not hold 3 KV heads");
  Llama model = grouped_llama(16, 4, 2, 1, 16, 32);  // KV rows of 8 floats: 2 heads of 4
  KVCache made = model.make_cache(), one_head(made.layers(), made.max_len(), made.width(), 1, 1);
  CHECK(made.kv_heads() == 2);
  one_head.bind(made.model(), {});  // bound to the model, as only its KV heads differ
  CHECK(test::error_of([&] { model.step(1, one_head); }) ==
        "CachePass::attention: the cache holds 1 KV heads a row, the model attends with 2; use model.make_cache()");
  CHECK_NOTHROW(model.step(1, made));
}

TEST_CASE_TEMPLATE("a step allocates nothing after the first, for 1 and 8 sequences on 1 and 2 threads, of either "
                   "cache type",
                   M, RotaryDecoder, Gpt2) {
  M model = small_model<M>(64);
  for (int threads : {1, 2})
    for (KVCacheType type : {KVCacheType::f32, KVCacheType::f16})
      for (std::size_t sequences : {1, 8}) {
        set_num_threads(threads);
        CAPTURE(threads);
        CAPTURE(sequences);
        CAPTURE(int(type));
        KVCache cache = model.make_cache(sequences, 0, type);
        std::vector<std::int32_t> tokens(sequences, 1);
        const float* first = model.step(tokens, cache).data();
        model.step(tokens, cache);  // threads of a parallel region may make their scratch on their first pass
        allocations = 0;
        counting = true;
        bool same = true;
        for (std::int32_t t = 0; t < 40; ++t) {
          std::fill(tokens.begin(), tokens.end(), t % 13);
          same = same && model.step(tokens, cache).data() == first;
        }
        counting = false;
        CHECK(same);
        CHECK(allocations == 0);
      }
  set_num_threads(0);
}

TEST_CASE_TEMPLATE("the cache's rows and a pass's scratch start on cache lines (whole-vector loads)", M, RotaryDecoder,
                   Gpt2) {
  M model = small_model<M>(24);
  KVCache cache = model.make_cache(3);
  model.step(std::vector<std::int32_t>{1, 2, 3}, cache);
  auto on_line = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; };
  for (std::size_t layer = 0; layer < cache.layers(); ++layer)
    for (std::size_t s = 0; s < cache.sequences(); ++s) {
      CHECK(on_line(cache.keys<float>(layer, s)));
      CHECK(on_line(cache.values<float>(layer, s)));
    }
  cache.scratch.at(0).rewind();
  for (std::size_t floats : {1, 17, 64, 1000}) CHECK(on_line(cache.scratch[0].take(floats)));
}
