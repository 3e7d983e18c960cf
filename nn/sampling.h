// Sampler: turns a row of logits into a token id. The order is fixed:
// temperature, then top-k, then top-p, then one draw from the project's seeded Rng.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/random.h"

namespace tapegrad::nn {

/// How the next token is drawn from the logits.
struct SamplingOptions {
  float temperature = 1.0f;  ///< 0 = greedy: argmax, the lowest id winning ties
  std::size_t top_k = 0;     ///< keep the k most probable ids (0 = all)
  float top_p = 1.0f;        ///< keep the smallest most-probable set whose probability reaches p
  /// Throws std::invalid_argument naming the bad value.
  void validate() const;
};

/// Draws token ids from rows of logits, in a fixed order: temperature, top-k, top-p, one draw.
class Sampler {
 public:
  /// A sampler with its own Rng seeded with seed (the same seed gives the same tokens).
  Sampler(SamplingOptions options, std::uint64_t seed);
  /// One token from logits (vocab); reuses its buffers (no allocation after the first call).
  std::int32_t next(std::span<const float> logits);
  /// The probabilities the draw used for the last call (zeros for filtered ids); for tests.
  std::span<const float> last_probabilities() const { return probs_; }

 private:
  SamplingOptions options_;
  Rng rng_;
  std::vector<float> probs_;
  std::vector<std::uint64_t> keys_;  // (rank, id) of each id, for top-k and top-p
};

/// argmax with the lowest index winning ties (a NaN never wins, unless it is the first logit).
std::int32_t argmax(std::span<const float> logits);

}  // namespace tapegrad::nn
