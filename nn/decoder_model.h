// DecoderModel<Model>: what a decoder-only language model gets from its one description
// (Note [One description], nn/tape_pass.h): forward and loss on the tape, and decoding through a
// KV cache of one sequence or many. Model derives from it (and from Module) and provides:
//   template <ModelPass P> typename P::Value run(P& p) const;  // the description: ids -> logits
//   config(): vocab, d_model, n_blocks, max_len, seed     // one attention per block, its K and V rows
//             (and kv_width() where they are not d_model wide: grouped-query attention)
//   dropout_step                                           // the training step (dropout streams)
// run<TapePass>, run<CachePass> and run<ModelPassArchetype> are instantiated where run is defined.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <vector>

#include "core/ops.h"
#include "nn/cache_pass.h"
#include "nn/tape_pass.h"

namespace tapegrad::nn {

/// The floats of one K (or V) row of a cache layer: the config's kv_width() where it has one,
/// else d_model.
template <class Config>
std::size_t kv_cache_width(const Config& c) {
  if constexpr (requires { c.kv_width(); }) return c.kv_width();
  else return c.d_model;
}

/// The heads of keys and values in a cache row: the config's kv_heads() where it has one (grouped-
/// query attention), else n_heads.
template <class Config>
std::size_t kv_cache_heads(const Config& c) {
  if constexpr (requires { c.kv_heads(); }) return c.kv_heads();
  else return c.n_heads;
}

/// The base (CRTP) of a decoder-only model: forward, loss and cached decoding, derived from
/// Model::run.
template <class Model>
class DecoderModel {
 public:
  using Cache = KVCache;  ///< The decoding state that make_cache() returns.

  /// ids (B*T, row-major) -> logits (B, T, vocab). T <= max_len.
  Var forward(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len) const {
    return run_on_tape(ids, {}, batch, seq_len);
  }
  /// Mean next-token cross-entropy of forward(inputs) against targets, both (B*T). A description
  /// whose head is a head op (p.head, p.tied_head) gets it fused with the loss, the logits never
  /// held whole (Note [Loss pass], nn/tape_pass.cpp); another returns logits, and gets their loss.
  Var loss(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets, std::size_t batch,
           std::size_t seq_len) const {
    if (targets.size() != inputs.size())
      throw std::invalid_argument(fmt::format("loss: {} targets for {} inputs", targets.size(), inputs.size()));
    Var result = run_on_tape(inputs, targets, batch, seq_len);
    return result.shape().empty() ? result : cross_entropy(result, targets);
  }

  /// A cache for `sequences` sequences of up to max_len tokens (0: the model's max_len; at most
  /// that), bound to this model: its steps read the weights as they are at each call and refuse
  /// rows computed under older weights. A shorter max_len saves memory: a real model's context
  /// of 8192 tokens is hundreds of MB of cache, half as much of 16-bit values (`type`).
  KVCache make_cache(std::size_t sequences = 1, std::size_t max_len = 0, KVCacheType type = KVCacheType::f32) const {
    const auto& c = model().config();
    if (max_len > c.max_len)
      throw std::invalid_argument(
          fmt::format("make_cache: max_len {} exceeds the model's max_len {}", max_len, c.max_len));
    KVCache cache(c.n_blocks, max_len == 0 ? c.max_len : max_len, kv_cache_width(c), sequences, kv_cache_heads(c),
                  type);
    std::vector<Var> handles;
    for (const auto& p : model().params()) handles.push_back(p.var);
    cache.bind(this, std::move(handles));
    return cache;
  }

  /// Appends tokens to one sequence of the cache in one pass; returns their logits (T, vocab), or
  /// with PrefillLogits::last_token the last token's alone (1, vocab).
  Tensor prefill(std::span<const std::int32_t> tokens, KVCache& cache, std::size_t sequence = 0,
                 PrefillLogits which = PrefillLogits::every_token) const {
    CachePass::Run run{sequence, 0, tokens.size(), tokens.data()};
    return prefill_runs(std::span(&run, 1), cache, which);
  }
  /// Appends prompts[s] to sequence s, for every s with a non-empty prompt, in one pass (the
  /// sequences split across threads). Returns the logits of every appended token, sequence after
  /// sequence: (total tokens, vocab); with PrefillLogits::last_token those of each non-empty
  /// prompt's last token: (non-empty prompts, vocab).
  Tensor prefill(std::span<const std::vector<std::int32_t>> prompts, KVCache& cache,
                 PrefillLogits which = PrefillLogits::every_token) const {
    if (prompts.size() > cache.sequences())
      throw std::invalid_argument(
          fmt::format("prefill: {} prompts for a cache of {} sequences", prompts.size(), cache.sequences()));
    std::vector<CachePass::Run> runs;
    for (std::size_t s = 0; s < prompts.size(); ++s)
      if (!prompts[s].empty()) runs.push_back({s, 0, prompts[s].size(), prompts[s].data()});
    return prefill_runs(runs, cache, which);
  }

  /// One token for each sequence of the cache (the tokens of dropped sequences are ignored):
  /// returns the logits (sequences, vocab), rows of dropped sequences NaN, a view into the cache
  /// valid until its next call. No tape; no allocation after the first call.
  std::span<const float> step(std::span<const std::int32_t> tokens, KVCache& cache) const {
    const std::size_t S = cache.sequences(), vocab = model().config().vocab;
    if (tokens.size() != S)
      throw std::invalid_argument(fmt::format("step: {} tokens for a cache of {} sequences", tokens.size(), S));
    if (cache.step_runs.size() < S) cache.step_runs.resize(S);
    std::size_t n = 0;
    for (std::size_t s = 0; s < S; ++s)
      if (cache.active(s)) cache.step_runs[n++] = {s, 0, 1, &tokens[s]};
    if (n == 0) throw std::invalid_argument("step: every sequence of the cache has been dropped");
    std::span<CachePass::Run> runs(cache.step_runs.data(), n);
    if (cache.step_logits.size() < S * vocab) cache.step_logits.resize(S * vocab);
    if (n == S) {
      decode(runs, cache, cache.step_logits.data());
    } else {  // the active rows, then spread out with NaN rows for the dropped sequences
      if (cache.active_logits.size() < n * vocab) cache.active_logits.resize(n * vocab);
      decode(runs, cache, cache.active_logits.data());
      for (std::size_t s = S, i = n; s-- > 0;) {
        float* row = cache.step_logits.data() + s * vocab;
        if (!cache.active(s)) std::fill_n(row, vocab, std::numeric_limits<float>::quiet_NaN());
        else std::copy_n(cache.active_logits.data() + --i * vocab, vocab, row);
      }
    }
    return {cache.step_logits.data(), S * vocab};
  }
  /// step() of a one-sequence cache: the logits (vocab) of its next position.
  std::span<const float> step(std::int32_t token, KVCache& cache) const { return step(std::span(&token, 1), cache); }

 private:
  const Model& model() const { return static_cast<const Model&>(*this); }

  // The description on a TapePass; a loss pass when targets are given.
  Var run_on_tape(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets, std::size_t batch,
                  std::size_t seq_len) const {
    if (seq_len > model().config().max_len)
      throw std::invalid_argument(
          fmt::format("forward: seq_len {} exceeds max_len {}", seq_len, model().config().max_len));
    TapePass p(ids, batch, seq_len, dropout_seed(model().config().seed, model().dropout_step, 0), targets);
    return model().run(p);
  }

  Tensor prefill_runs(std::span<CachePass::Run> runs, KVCache& cache, PrefillLogits which) const {
    std::size_t total = 0;
    for (const auto& run : runs) total += run.count;
    if (total == 0) throw std::invalid_argument("prefill: no tokens to write");
    const std::size_t rows = which == PrefillLogits::every_token ? total : runs.size();
    Tensor logits = Tensor::uninitialized({rows, model().config().vocab});
    decode(runs, cache, logits.data(), which);
    return logits;
  }

  /// Checks the request against the cache and the model, then runs the description on it.
  void decode(std::span<CachePass::Run> runs, KVCache& cache, float* logits,
              PrefillLogits which = PrefillLogits::every_token) const {
    const auto& c = model().config();
    check_decode(runs, cache, this, c.n_blocks, c.max_len, kv_cache_width(c), c.vocab);
    run_cache_passes(cache, {runs, c.vocab, logits, which}, [this](CachePass& p) { return model().run(p); });
  }
};

}  // namespace tapegrad::nn
