// Rng: a seeded xoshiro256** generator (Blackman & Vigna) with its own distributions, so a seed
// gives the same numbers on every compiler and machine (std:: distributions differ between
// standard libraries).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tapegrad {

class Tensor;

/// The project's seeded generator, xoshiro256** with its own distributions, so that a seed gives
/// the same numbers on every compiler and machine.
class Rng {
 public:
  /// A generator whose state is seeded from seed by splitmix64 (nearby seeds give unrelated streams).
  explicit Rng(std::uint64_t seed = 0);

  /// The next 64 random bits.
  std::uint64_t next_u64();
  /// Uniform in [0, 1) with 24 random bits (every value exactly representable in float).
  float uniform();
  /// Uniform integer in [0, n), without modulo bias.
  std::uint64_t below(std::uint64_t n);
  /// Standard normal by Box-Muller in double, rounded to float once.
  float normal();
  /// Index drawn with probability weights[i] / sum(weights); weights are non-negative.
  std::size_t categorical(const float* weights, std::size_t count);

  /// Fills t with normal(0, stddev) values, in storage order; inside a SkipInitScope, leaves t
  /// as it is and draws nothing.
  void fill_normal(Tensor& t, float stddev);

  /// The full state as text ("s0 s1 s2 s3" in decimal), for checkpoints.
  std::string state() const;
  /// Restores a state() string; throws std::invalid_argument on anything malformed.
  void set_state(const std::string& text);

 private:
  std::array<std::uint64_t, 4> s_{};
};

/// While alive, parameter initialisation (Rng::fill_normal) on this thread is skipped: a model
/// whose every weight a loader is about to assign is built at the cost of its allocation (as
/// transformers' no_init_weights). Scopes nest.
class SkipInitScope {
 public:
  SkipInitScope();
  ~SkipInitScope();
  SkipInitScope(const SkipInitScope&) = delete;
  SkipInitScope& operator=(const SkipInitScope&) = delete;
  static bool active();  ///< Whether a scope is alive on this thread.
};

}  // namespace tapegrad
