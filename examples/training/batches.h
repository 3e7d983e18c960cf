// Training and evaluation inputs for a language model: random windows of a token stream
// (nanoGPT's get_batch) and the windowed cross-entropy of a whole text (what evaluate prints).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/random.h"
#include "nn/language_model.h"

namespace tapegrad::examples {

/// batch windows of seq_len tokens, row-major (B, T): inputs ids[s:s+T], targets ids[s+1:s+T+1].
struct Batch {
  std::vector<std::int32_t> inputs, targets;
  std::size_t batch = 0, seq_len = 0;
};

/// Draws each window's start s uniformly from [0, n - T - 1] with rng.below (the project's own
/// distribution, so a seed gives the same batches everywhere). Requires n >= seq_len + 1.
Batch sample_batch(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len, Rng& rng);

/// Mean loss of the model over n_batches random batches of ids drawn from a fresh Rng(seed), so
/// every call with the same seed sees the same windows. Windows are min(seq_len, n - 1) long.
/// Runs without a tape.
double sampled_loss(const nn::LanguageModel& model, std::span<const std::int32_t> ids, std::size_t batch,
                    std::size_t seq_len, std::size_t n_batches, std::uint64_t seed);

struct WindowedLoss {
  double loss = 0;         // mean next-token cross-entropy over every predicted token, in nats
  std::size_t tokens = 0;  // tokens predicted
};

/// The mean next-token loss of a whole text, in windows of `window` tokens (0: the model's
/// max_len): for s = 0, W, 2W, ... while s + 1 < n: inputs ids[s:s+L], targets ids[s+1:s+L+1],
/// L = min(W, n-1-s); the mean over all predicted tokens (each window weighted by its length).
/// Full windows go through the model up to `group` at a time, fewer when their logits would pass
/// 128 MB (a real model's vocabulary). n >= 2; window <= max_len.
WindowedLoss windowed_loss(const nn::LanguageModel& model, std::span<const std::int32_t> ids, std::size_t window = 0,
                           std::size_t group = 16);

/// windowed_loss's windows, each prefilled through a fresh KV cache of `cache_type`: the loss of a
/// model whose matrices are packed (nn/packed_weights.h), which only decoding runs, or of a 16-bit
/// cache.
WindowedLoss decoded_windowed_loss(const nn::LanguageModel& model, std::span<const std::int32_t> ids,
                                   std::size_t window, nn::KVCacheType cache_type = nn::KVCacheType::f32);

}  // namespace tapegrad::examples
