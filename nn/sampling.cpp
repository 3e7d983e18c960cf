// Temperature, top-k, top-p and the draw.
#include "nn/sampling.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace tapegrad::nn {

void SamplingOptions::validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature))
    throw std::invalid_argument(fmt::format("sampling: temperature must be a finite number >= 0, got {}", temperature));
  if (!(top_p > 0 && top_p <= 1))
    throw std::invalid_argument(fmt::format("sampling: top_p must be in (0, 1], got {}", top_p));
}

std::int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) throw std::invalid_argument("argmax: no logits");
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;  // strict: ties keep the lower id
  return std::int32_t(best);
}

Sampler::Sampler(SamplingOptions options, std::uint64_t seed) : options_(options), rng_(seed) { options_.validate(); }

std::int32_t Sampler::next(std::span<const float> logits) {
  for (float l : logits)
    if (std::isnan(l)) throw std::runtime_error("sampling: the logits contain NaN");
  if (options_.temperature == 0) return argmax(logits);
  const std::size_t n = logits.size();
  probs_.resize(n);
  order_.resize(n);
  // 1. temperature: softmax(logits / T), in double for the normaliser.
  float top = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) total += probs_[i] = float(std::exp(double(logits[i] - top) / options_.temperature));
  for (float& p : probs_) p = float(p / total);
  bool filter_k = options_.top_k > 0 && options_.top_k < n, filter_p = options_.top_p < 1;
  if (filter_k || filter_p) {
    // Most probable first; equal probabilities keep the lower id first.
    std::iota(order_.begin(), order_.end(), 0);
    std::stable_sort(order_.begin(), order_.end(), [&](std::int32_t a, std::int32_t b) { return probs_[a] > probs_[b]; });
    // 2. top-k, then 3. top-p over what top-k kept (renormalised).
    std::size_t keep = filter_k ? options_.top_k : n;
    if (filter_p) {
      double kept_total = 0, cumulative = 0;
      for (std::size_t i = 0; i < keep; ++i) kept_total += probs_[order_[i]];
      std::size_t needed = 0;
      while (needed < keep) {
        cumulative += probs_[order_[needed++]] / kept_total;
        if (cumulative >= options_.top_p) break;
      }
      keep = needed;
    }
    for (std::size_t i = keep; i < n; ++i) probs_[order_[i]] = 0;
  }
  // 4. one draw (categorical renormalises over what is left).
  return std::int32_t(rng_.categorical(probs_.data(), n));
}

}  // namespace tapegrad::nn
