// Random training windows and windowed evaluation.
#include "training/batches.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/tape.h"

namespace tapegrad::examples {

Batch sample_batch(std::span<const std::int32_t> ids, std::size_t batch, std::size_t seq_len, Rng& rng) {
  if (seq_len == 0 || ids.size() < seq_len + 1)
    throw std::invalid_argument(fmt::format("sample_batch: windows of {} tokens need at least {} tokens, got {}",
                                            seq_len, seq_len + 1, ids.size()));
  Batch out{std::vector<std::int32_t>(batch * seq_len), std::vector<std::int32_t>(batch * seq_len), batch, seq_len};
  for (std::size_t b = 0; b < batch; ++b) {
    const std::size_t start = rng.below(ids.size() - seq_len);
    std::copy_n(ids.begin() + start, seq_len, out.inputs.begin() + b * seq_len);
    std::copy_n(ids.begin() + start + 1, seq_len, out.targets.begin() + b * seq_len);
  }
  return out;
}

double sampled_loss(const nn::LanguageModel& model, std::span<const std::int32_t> ids, std::size_t batch,
                    std::size_t seq_len, std::size_t n_batches, std::uint64_t seed) {
  NoGradScope no_grad;
  Rng rng(seed);
  const std::size_t window = std::min(seq_len, ids.size() - 1);
  double sum = 0;
  for (std::size_t i = 0; i < n_batches; ++i) {
    Batch b = sample_batch(ids, batch, window, rng);
    sum += model.loss(b.inputs, b.targets, b.batch, b.seq_len).value().item();
  }
  return sum / double(n_batches);
}

WindowedLoss windowed_loss(const nn::LanguageModel& model, std::span<const std::int32_t> ids, std::size_t window,
                           std::size_t group) {
  const std::size_t n = ids.size(), max_len = window ? window : model.config().max_len;
  if (n < 2) throw std::invalid_argument(fmt::format("windowed_loss: the text has {} tokens; at least 2 are needed", n));
  if (max_len > model.config().max_len)
    throw std::invalid_argument(
        fmt::format("windowed_loss: windows of {} tokens exceed the model's max_len {}", max_len, model.config().max_len));
  constexpr std::size_t max_logits = std::size_t(1) << 25;  // floats: 128 MB
  group = std::clamp<std::size_t>(max_logits / (max_len * model.config().vocab), 1, group);
  NoGradScope no_grad;
  WindowedLoss out;
  double sum = 0;  // sum of per-token losses, in double
  std::size_t s = 0;
  std::vector<std::int32_t> inputs, targets;
  while (s + 1 < n) {
    // Full windows, up to `group` of them in one (B, T) batch; then the short tail.
    const std::size_t length = std::min(max_len, n - 1 - s);
    std::size_t count = 1;
    if (length == max_len) count = std::min(group, (n - 1 - s) / max_len);
    inputs.assign(ids.begin() + s, ids.begin() + s + count * length);
    targets.assign(ids.begin() + s + 1, ids.begin() + s + 1 + count * length);
    const double mean = model.loss(inputs, targets, count, length).value().item();
    sum += mean * double(count * length);
    out.tokens += count * length;
    s += count * length;
  }
  out.loss = sum / double(out.tokens);
  return out;
}

WindowedLoss decoded_windowed_loss(const nn::LanguageModel& model, std::span<const std::int32_t> ids,
                                   std::size_t window, nn::KVCacheType cache_type) {
  const std::size_t n = ids.size(), vocab = model.config().vocab;
  if (n < 2) throw std::invalid_argument(fmt::format("windowed_loss: the text has {} tokens; at least 2 are needed", n));
  WindowedLoss out;
  double sum = 0;
  for (std::size_t s = 0; s + 1 < n; s += window) {
    const std::size_t length = std::min(window, n - 1 - s);
    nn::KVCache cache = model.make_cache(1, length, cache_type);
    const Tensor logits = model.prefill(ids.subspan(s, length), cache);  // (length, vocab)
    for (std::size_t t = 0; t < length; ++t) {
      const float* row = logits.data() + t * vocab;
      const double max = *std::max_element(row, row + vocab);
      double exp_sum = 0;
      for (std::size_t v = 0; v < vocab; ++v) exp_sum += std::exp(double(row[v]) - max);
      sum += max + std::log(exp_sum) - row[ids[s + t + 1]];
    }
    out.tokens += length;
  }
  out.loss = sum / double(out.tokens);
  return out;
}

}  // namespace tapegrad::examples
