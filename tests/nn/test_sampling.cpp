// Sampling: greedy ties, seeded draws, and temperature, top-k and top-p in that order.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "nn/sampling.h"
#include "support/helpers.h"

using namespace tapegrad;
using namespace tapegrad::nn;

TEST_CASE("greedy takes the argmax and ties go to the lowest id") {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  Sampler s({.temperature = 0.0f}, 1);
  CHECK(s.next(logits) == 1);
  CHECK(argmax(std::vector<float>{3, 3, 3}) == 0);
}

TEST_CASE("the same seed gives the same draws; top-k 1 equals greedy") {
  std::vector<float> logits = {0.1f, 0.4f, 0.3f, 0.2f, -0.5f};
  Sampler a({.temperature = 1.0f}, 42), b({.temperature = 1.0f}, 42), k1({.temperature = 1.3f, .top_k = 1}, 9);
  for (int i = 0; i < 50; ++i) {
    CHECK(a.next(logits) == b.next(logits));
    CHECK(k1.next(logits) == 1);
  }
}

TEST_CASE("temperature, top-k and top-p filter in that order") {
  // softmax at T = 1 of log-probabilities: 0.4, 0.3, 0.2, 0.1
  std::vector<float> logits = {std::log(0.1f), std::log(0.4f), std::log(0.2f), std::log(0.3f)};
  Sampler top_k({.temperature = 1.0f, .top_k = 2}, 1);
  top_k.next(logits);
  auto p = top_k.last_probabilities();
  CHECK(p[0] == 0.0f);
  CHECK(p[2] == 0.0f);
  CHECK(p[1] == doctest::Approx(0.4));
  // top-p 0.65: 0.4 + 0.3 = 0.7 >= 0.65 is the smallest set reaching it.
  Sampler top_p({.temperature = 1.0f, .top_p = 0.65f}, 1);
  top_p.next(logits);
  p = top_p.last_probabilities();
  CHECK(p[1] > 0.0f);
  CHECK(p[3] > 0.0f);
  CHECK(p[0] == 0.0f);
  CHECK(p[2] == 0.0f);
  // top-p exactly at a boundary keeps just that set: 0.4 reaches 0.4.
  Sampler exact({.temperature = 1.0f, .top_p = 0.4f}, 1);
  for (int i = 0; i < 20; ++i) CHECK(exact.next(logits) == 1);
  // top-k then top-p: top-2 renormalised is 4/7, 3/7; p = 0.5 keeps only the first.
  Sampler both({.temperature = 1.0f, .top_k = 2, .top_p = 0.5f}, 1);
  for (int i = 0; i < 20; ++i) CHECK(both.next(logits) == 1);
  // A high temperature flattens the distribution before filtering.
  Sampler hot({.temperature = 100.0f}, 1);
  hot.next(logits);
  CHECK(std::fabs(hot.last_probabilities()[0] - 0.25f) < 0.01f);
}

namespace {

// The sampler as it was first written, sorting every id by probability: what the selection
// must reproduce bit for bit (the same probabilities, the same draws from the same seed).
struct SortingSampler {
  SamplingOptions options;
  Rng rng;
  std::vector<float> probs;
  std::int32_t next(std::span<const float> logits) {
    const std::size_t n = logits.size();
    probs.resize(n);
    float top = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (std::size_t i = 0; i < n; ++i) total += probs[i] = float(std::exp(double(logits[i] - top) / options.temperature));
    for (float& p : probs) p = float(p / total);
    std::vector<std::int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return probs[a] > probs[b]; });
    std::size_t keep = options.top_k > 0 && options.top_k < n ? options.top_k : n;
    if (options.top_p < 1) {
      double kept_total = 0, cumulative = 0;
      for (std::size_t i = 0; i < keep; ++i) kept_total += probs[order[i]];
      std::size_t needed = 0;
      while (needed < keep) {
        cumulative += probs[order[needed++]] / kept_total;
        if (cumulative >= options.top_p) break;
      }
      keep = needed;
    }
    for (std::size_t i = keep; i < n; ++i) probs[order[i]] = 0;
    return std::int32_t(rng.categorical(probs.data(), n));
  }
};

}  // namespace

TEST_CASE("top-k and top-p draw the tokens and probabilities of a stable sort of every id, bit for bit") {
  // Logits rounded to eighths: many equal probabilities, whose order (by id) decides what is kept.
  for (std::size_t vocab : {7, 1000, 49152}) {
    std::vector<float> logits = test::random_vector<float>(vocab, vocab, 3.0);
    for (float& l : logits) l = std::round(l * 8) / 8;
    for (std::size_t top_k : {0, 1, 5, 64, 999})
      for (float top_p : {1.0f, 0.9f, 0.3f})
        for (float temperature : {0.7f, 1.5f}) {
          const SamplingOptions options{.temperature = temperature, .top_k = top_k, .top_p = top_p};
          Sampler sampler(options, 11);
          SortingSampler reference{options, Rng(11), {}};
          for (int draw = 0; draw < 8; ++draw) {
            const std::int32_t token = sampler.next(logits), want = reference.next(logits);
            CHECK_MESSAGE(token == want, "vocab ", vocab, " top_k ", top_k, " top_p ", top_p, " T ", temperature);
            CHECK(std::memcmp(sampler.last_probabilities().data(), reference.probs.data(), vocab * sizeof(float)) == 0);
          }
        }
  }
}

TEST_CASE("argmax is the first of the largest logits wherever it falls, past NaNs and signed zeros") {
  for (std::size_t n : {1, 15, 16, 17, 33, 100}) {
    for (std::size_t at = 0; at < n; at += 7) {
      std::vector<float> logits(n, -1.0f);
      logits[at] = 2.0f;
      CHECK(argmax(logits) == std::int32_t(at));
      if (at + 1 < n) logits[n - 1] = 2.0f;  // a tie after it: the first still wins
      CHECK(argmax(logits) == std::int32_t(at));
      const std::size_t nan_at = (at + 3) % n;  // a NaN not first is never the largest
      if (nan_at != 0 && nan_at != at) logits[nan_at] = NAN;
      CHECK(argmax(logits) == std::int32_t(at));
    }
  }
  CHECK(argmax(std::vector<float>{NAN, 1.0f, 2.0f}) == 0);  // as a scan keeping the first NaN
  CHECK(argmax(std::vector<float>{-0.0f, 0.0f, -1.0f}) == 0);
  CHECK(argmax(std::vector<float>{-3.0f, 0.0f, -0.0f}) == 1);
}

TEST_CASE("sampled frequencies follow the probabilities") {
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler s({.temperature = 1.0f}, 3);
  int counts[3] = {};
  for (int i = 0; i < 30000; ++i) ++counts[s.next(logits)];
  CHECK(std::abs(counts[0] - 15000) < 400);
  CHECK(std::abs(counts[2] - 6000) < 300);
}

TEST_CASE("bad sampling options name the value") {
  CHECK(test::error_of([] { Sampler({.temperature = -1.0f}, 0); }) ==
        "sampling: temperature must be a finite number >= 0, got -1");
  CHECK(test::error_of([] { Sampler({.top_p = 0.0f}, 0); }) == "sampling: top_p must be in (0, 1], got 0");
  Sampler s({}, 0);
  CHECK(test::error_of([&] { s.next(std::vector<float>{1.0f, NAN}); }) == "sampling: the logits contain NaN");
}
