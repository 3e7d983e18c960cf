// generate: autoregressive decoding for any model with a full forward; models that also offer a
// KV cache (prefill + step) are decoded through it, unless the options ask for the no-cache path
// that re-runs the full forward over the whole text for every new token (for checks and benches).
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "core/ops.h"
#include "nn/sampling.h"

namespace tapegrad::nn {

struct GenerateOptions {
  std::size_t max_new = 100;
  SamplingOptions sampling;
  std::uint64_t seed = 0;
  bool use_cache = true;
};

struct Generation {
  std::vector<std::int32_t> tokens;  // the new tokens, without the prompt
  bool stopped_at_max_len = false;   // fewer than max_new: the text reached the model's max_len
};

/// A model with forward(ids, batch, seq_len) -> logits (B, T, vocab) and config().{vocab, max_len}.
template <class M>
concept ForwardModel = requires(const M& m, std::span<const std::int32_t> ids) {
  { m.forward(ids, std::size_t{1}, std::size_t{1}) } -> std::convertible_to<Var>;
  { m.config().max_len } -> std::convertible_to<std::size_t>;
  { m.config().vocab } -> std::convertible_to<std::size_t>;
};

/// A ForwardModel that also decodes through a cache.
template <class M>
concept CachedModel = ForwardModel<M> && requires(const M& m, typename M::Cache& cache,
                                                  std::span<const std::int32_t> ids, std::int32_t token) {
  { m.make_cache() } -> std::same_as<typename M::Cache>;
  { m.prefill(ids, cache) } -> std::convertible_to<Tensor>;
  { m.step(token, cache) } -> std::convertible_to<std::span<const float>>;
};

/// Generates up to options.max_new tokens after prompt; on_token (if set) sees each as it comes.
template <ForwardModel M>
Generation generate(const M& model, std::span<const std::int32_t> prompt, const GenerateOptions& options,
                    const std::function<void(std::int32_t)>& on_token = {}) {
  const std::size_t max_len = model.config().max_len, vocab = model.config().vocab;
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt is empty; give at least one token");
  if (prompt.size() > max_len)
    throw std::invalid_argument(
        fmt::format("generate: the prompt has {} tokens, longer than max_len {}", prompt.size(), max_len));
  Sampler sampler(options.sampling, options.seed);
  Generation out;
  std::vector<std::int32_t> text(prompt.begin(), prompt.end());
  auto emit = [&](std::span<const float> logits) {
    std::int32_t token = sampler.next(logits);
    out.tokens.push_back(token);
    text.push_back(token);
    if (on_token) on_token(token);
  };
  // The text can grow to max_len tokens: the last one is predicted from position max_len - 1.
  std::size_t budget = std::min(options.max_new, max_len - prompt.size());
  out.stopped_at_max_len = budget < options.max_new;
  if (budget == 0) return out;
  NoGradScope no_grad;
  if constexpr (CachedModel<M>) {
    if (options.use_cache) {
      auto cache = model.make_cache();
      Tensor logits = model.prefill(prompt, cache);
      emit(std::span<const float>(logits.data() + (prompt.size() - 1) * vocab, vocab));
      while (out.tokens.size() < budget) emit(model.step(text.back(), cache));
      return out;
    }
  }
  while (out.tokens.size() < budget) {
    Var logits = model.forward(text, 1, text.size());
    emit(std::span<const float>(logits.value().data() + (text.size() - 1) * vocab, vocab));
  }
  return out;
}

}  // namespace tapegrad::nn
