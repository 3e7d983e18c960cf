#include <doctest/doctest.h>

#include <cmath>

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
