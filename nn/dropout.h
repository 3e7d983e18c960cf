// Dropout (Srivastava et al. 2014): zeroes each element with probability p in training and
// scales the rest by 1 / (1 - p); the identity in evaluation mode and in generation.
#pragma once

#include "core/ops.h"
#include "nn/module.h"

namespace tapegrad::nn {

/// Dropout(p) as a module: no parameters; active in training mode when p > 0.
class Dropout : public Module {
 public:
  /// p in [0, 1): the probability of zeroing an element.
  explicit Dropout(float p = 0);
  /// The mask comes from rng: the caller owns the stream (a model derives one from its seed,
  /// per step and per block, so that remat re-draws the very same mask).
  Var forward(const Var& x, Rng& rng) const { return dropout(x, p, training() && p > 0, rng); }
  bool active() const { return training() && p > 0; }  ///< Whether forward draws a mask.
  void members(Members&) override {}  ///< None: no parameters, no children.

  float p;  ///< the probability of zeroing an element
};

/// The seed of a dropout stream: a SplitMix64 mix of (seed, step, index), so that streams of
/// different steps or blocks are unrelated and a resumed run recomputes them from its step.
std::uint64_t dropout_seed(std::uint64_t seed, std::uint64_t step, std::uint64_t index);

}  // namespace tapegrad::nn
