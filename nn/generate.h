// generate: autoregressive decoding for any model with a full forward, of one sample or many;
// models that also offer a KV cache (prefill + step) are decoded through it, many samples as one
// batch, unless the options ask for the no-cache path that re-runs the full forward over the
// whole text for every new token (for checks and benches).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "core/ops.h"
#include "nn/kv_cache.h"
#include "nn/sampling.h"

namespace tapegrad::nn {

/// What generate and generate_samples do.
struct GenerateOptions {
  std::size_t max_new = 100;  ///< the most new tokens per sample
  SamplingOptions sampling;   ///< how each token is drawn from the logits
  std::uint64_t seed = 0;     ///< the Sampler's seed (sample i: seed + i)
  bool use_cache = true;      ///< decode through the KV cache when the model has one
  KVCacheType cache_type = KVCacheType::f32;  ///< what the cache holds each key and value as
  /// Tokens that end a sample (a model's end-of-text ids): drawn, it ends there, not kept.
  std::vector<std::int32_t> stop_ids;
};

/// One sample's output.
struct Generation {
  std::vector<std::int32_t> tokens;  ///< the new tokens, without the prompt
  bool stopped_at_max_len = false;   ///< fewer than max_new: the text reached the model's max_len
  bool stopped_at_stop_id = false;   ///< it drew one of options.stop_ids (not in tokens)
};

/// A model with forward(ids, batch, seq_len) -> logits (B, T, vocab) and config().{vocab, max_len}.
template <class M>
concept ForwardModel = requires(const M& m, std::span<const std::int32_t> ids) {
  { m.forward(ids, std::size_t{1}, std::size_t{1}) } -> std::convertible_to<Var>;
  { m.config().max_len } -> std::convertible_to<std::size_t>;
  { m.config().vocab } -> std::convertible_to<std::size_t>;
};

/// A ForwardModel that also decodes through a cache of many sequences (nn/decoder_model.h).
template <class M>
concept CachedModel = ForwardModel<M> && requires(const M& m, typename M::Cache& cache,
                                                  std::span<const std::vector<std::int32_t>> prompts,
                                                  std::span<const std::int32_t> tokens) {
  { m.make_cache(std::size_t{1}, std::size_t{1}, KVCacheType::f32) } -> std::same_as<typename M::Cache>;
  { m.prefill(prompts, cache) } -> std::convertible_to<Tensor>;
  { m.step(tokens, cache) } -> std::convertible_to<std::span<const float>>;
};

/// Generates `samples` continuations of prompt, up to options.max_new tokens each. Sample i draws
/// from a Sampler seeded options.seed + i, so it is exactly the text that one sample with that
/// seed gives: a CachedModel decodes all of them as one batch (one prefill pass, then one step
/// per token for every sample), and a sequence's logits do not depend on the batch around it.
/// on_token (if set) sees (sample, token) as each comes, stop ids excepted. The cache holds the
/// prompt and the new tokens, not the model's whole context. Without a cache (or with use_cache
/// false) the samples run one after another through the full forward over the whole text.
template <ForwardModel M>
std::vector<Generation> generate_samples(const M& model, std::span<const std::int32_t> prompt, std::size_t samples,
                                         const GenerateOptions& options,
                                         const std::function<void(std::size_t, std::int32_t)>& on_token = {}) {
  const std::size_t max_len = model.config().max_len, vocab = model.config().vocab;
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt is empty; give at least one token");
  if (prompt.size() > max_len)
    throw std::invalid_argument(
        fmt::format("generate: the prompt has {} tokens, longer than max_len {}", prompt.size(), max_len));
  if (samples == 0) throw std::invalid_argument("generate: the number of samples must be at least 1");
  // The text can grow to max_len tokens: the last one is predicted from position max_len - 1.
  const std::size_t budget = std::min(options.max_new, max_len - prompt.size());
  // The cache first: it refuses more sequences than it can hold before anything per sample exists.
  auto cache = [&] {
    if constexpr (CachedModel<M>)
      return options.use_cache ? std::optional(model.make_cache(samples, prompt.size() + budget, options.cache_type))
                               : std::nullopt;
    else
      return std::optional<int>();
  }();
  std::vector<Generation> out(samples);
  std::vector<Sampler> samplers;
  for (std::size_t i = 0; i < samples; ++i) {
    out[i].stopped_at_max_len = budget < options.max_new;
    samplers.emplace_back(options.sampling, options.seed + i);
  }
  if (budget == 0) return out;
  // Draws sample i's next token; false when it is a stop id (the sample has ended).
  auto emit = [&](std::size_t i, std::span<const float> logits, std::int32_t& token) {
    token = samplers[i].next(logits);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), token) != options.stop_ids.end()) {
      out[i].stopped_at_stop_id = true;
      out[i].stopped_at_max_len = false;
      return false;
    }
    out[i].tokens.push_back(token);
    if (on_token) on_token(i, token);
    return true;
  };
  NoGradScope no_grad;
  if constexpr (CachedModel<M>) {
    if (cache) {
      std::vector<std::vector<std::int32_t>> prompts(samples, std::vector<std::int32_t>(prompt.begin(), prompt.end()));
      // The prompts' last rows alone (samples, vocab), where the model can compute just those.
      constexpr bool last_rows_only = requires { model.prefill(prompts, *cache, PrefillLogits::last_token); };
      Tensor logits = [&] {
        if constexpr (last_rows_only) return model.prefill(prompts, *cache, PrefillLogits::last_token);
        else return model.prefill(prompts, *cache);  // (samples * prompt, vocab)
      }();
      const std::size_t rows_per_sample = last_rows_only ? 1 : prompt.size();
      std::vector<std::int32_t> last(samples);
      std::size_t running = 0;
      for (std::size_t i = 0; i < samples; ++i) {
        if (emit(i, std::span<const float>(logits.data() + ((i + 1) * rows_per_sample - 1) * vocab, vocab), last[i]))
          ++running;
        else
          cache->drop(i);
      }
      for (std::size_t t = 1; t < budget && running > 0; ++t) {
        std::span<const float> rows = model.step(last, *cache);  // (samples, vocab), ended samples' rows NaN
        for (std::size_t i = 0; i < samples; ++i)
          if (cache->active(i) && !emit(i, rows.subspan(i * vocab, vocab), last[i])) {
            cache->drop(i);
            --running;
          }
      }
      return out;
    }
  }
  for (std::size_t i = 0; i < samples; ++i) {
    std::vector<std::int32_t> text(prompt.begin(), prompt.end());
    std::int32_t token = 0;
    while (out[i].tokens.size() < budget) {
      Var logits = model.forward(text, 1, text.size());
      if (!emit(i, std::span<const float>(logits.value().data() + (text.size() - 1) * vocab, vocab), token)) break;
      text.push_back(token);
    }
  }
  return out;
}

/// One sample: generate_samples with samples = 1; on_token (if set) sees each token as it comes.
template <ForwardModel M>
Generation generate(const M& model, std::span<const std::int32_t> prompt, const GenerateOptions& options,
                    const std::function<void(std::int32_t)>& on_token = {}) {
  std::function<void(std::size_t, std::int32_t)> each;
  if (on_token) each = [&](std::size_t, std::int32_t token) { on_token(token); };
  return std::move(generate_samples(model, prompt, 1, options, each).front());
}

}  // namespace tapegrad::nn
