// Temperature, top-k, top-p and the draw; argmax. Over a vocabulary of 49,152 ids a token's
// sampling costs passes over the logits, never a sort of all of them unless top-p alone asks.
#include "nn/sampling.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>

namespace tapegrad::nn {

namespace {

// The NaN check runs over chunks of this many floats, a loop of a fixed trip count with no
// branch, which the compiler turns into vector code.
constexpr std::size_t chunk = 16;

bool has_nan(std::span<const float> x) {
  unsigned nan = 0;  // (a bool here kept GCC 12 from vectorising the loop)
  std::size_t i = 0;
  for (; i + chunk <= x.size(); i += chunk)
    for (std::size_t j = 0; j < chunk; ++j) nan |= x[i + j] != x[i + j];
  for (; i < x.size(); ++i) nan |= x[i] != x[i];
  return nan != 0;
}

// The float's order as an int32 (-0 just below +0), for a maximum the compiler vectorises (a
// float maximum it leaves scalar without -ffinite-math-only).
std::int32_t order_key(float x) {
  const std::int32_t bits = std::bit_cast<std::int32_t>(x);
  return bits ^ ((bits >> 31) & 0x7fffffff);
}

// argmax of logits without NaN: the largest key in `chunk` lanes, then the first logit of that
// key, or of either zero when the largest is a zero (a scan keeping the first of equal values
// does not tell -0 from +0).
std::int32_t argmax_of_numbers(std::span<const float> logits) {
  const std::size_t n = logits.size();
  std::int32_t lanes[chunk];
  std::fill_n(lanes, chunk, order_key(logits[0]));
  std::size_t i = 0;
  for (; i + chunk <= n; i += chunk)
    for (std::size_t j = 0; j < chunk; ++j) lanes[j] = std::max(lanes[j], order_key(logits[i + j]));
  for (; i < n; ++i) lanes[0] = std::max(lanes[0], order_key(logits[i]));
  const std::int32_t top_key = *std::max_element(lanes, lanes + chunk);
  const float top = std::bit_cast<float>(order_key(std::bit_cast<float>(top_key)));  // its own inverse
  i = 0;
  if (top != 0)
    for (; i + chunk <= n; i += chunk) {
      unsigned found = 0;
      for (std::size_t j = 0; j < chunk; ++j) found |= order_key(logits[i + j]) == top_key;
      if (found) break;
    }
  while (logits[i] != top) ++i;
  return std::int32_t(i);
}

// The key that orders ids most probable first, equal probabilities by increasing id (as the
// stable sort by probability did): a probability >= 0 has the same order as its bits.
std::uint64_t rank_key(float probability, std::size_t id) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(probability);
  return std::uint64_t(~bits) << 32 | std::uint32_t(id);
}
std::int32_t id_of(std::uint64_t key) { return std::int32_t(std::uint32_t(key)); }

}  // namespace

void SamplingOptions::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature))
    throw std::invalid_argument(fmt::format("sampling: temperature must be a finite number >= 0, got {}", temperature));
  if (!(top_p > 0 && top_p <= 1))
    throw std::invalid_argument(fmt::format("sampling: top_p must be in (0, 1], got {}", top_p));
}

std::int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) throw std::invalid_argument("argmax: no logits");
  if (has_nan(logits)) {  // a scan that keeps the first of equal values and ignores later NaNs
    std::size_t best = 0;
    for (std::size_t i = 1; i < logits.size(); ++i)
      if (logits[i] > logits[best]) best = i;
    return std::int32_t(best);
  }
  return argmax_of_numbers(logits);
}

Sampler::Sampler(SamplingOptions options, std::uint64_t seed) : options_(options), rng_(seed) { options_.validate(); }

std::int32_t Sampler::next(std::span<const float> logits) {
  if (has_nan(logits)) throw std::runtime_error("sampling: the logits contain NaN");
  if (options_.temperature == 0) return argmax_of_numbers(logits);
  const std::size_t n = logits.size();
  probs_.resize(n);
  // 1. temperature: softmax(logits / T), in double for the normaliser.
  float top = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) total += probs_[i] = float(std::exp(double(logits[i] - top) / options_.temperature));
  for (float& p : probs_) p = float(p / total);
  const bool filter_k = options_.top_k > 0 && options_.top_k < n, filter_p = options_.top_p < 1;
  if (filter_k || filter_p) {
    // Most probable first (rank_key). Top-k needs only which ids are the k first: a selection in
    // linear time; top-p needs them in order, and sums them in that order.
    keys_.resize(n);
    for (std::size_t i = 0; i < n; ++i) keys_[i] = rank_key(probs_[i], i);
    // 2. top-k, then 3. top-p over what top-k kept (renormalised).
    std::size_t keep = filter_k ? options_.top_k : n;
    if (filter_k) std::nth_element(keys_.begin(), keys_.begin() + std::ptrdiff_t(keep), keys_.end());
    if (filter_p) {
      std::sort(keys_.begin(), keys_.begin() + std::ptrdiff_t(keep));
      double kept_total = 0, cumulative = 0;
      for (std::size_t i = 0; i < keep; ++i) kept_total += probs_[id_of(keys_[i])];
      std::size_t needed = 0;
      while (needed < keep) {
        cumulative += probs_[id_of(keys_[needed++])] / kept_total;
        if (cumulative >= options_.top_p) break;
      }
      keep = needed;
    }
    for (std::size_t i = keep; i < n; ++i) probs_[id_of(keys_[i])] = 0;
  }
  // 4. one draw (categorical renormalises over what is left).
  return std::int32_t(rng_.categorical(probs_.data(), n));
}

}  // namespace tapegrad::nn
