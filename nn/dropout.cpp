// Dropout module and the derivation of its random streams.
#include "nn/dropout.h"

#include <fmt/format.h>

#include <stdexcept>

namespace tapegrad::nn {

Dropout::Dropout(float p_) : p(p_) {
  if (!(p >= 0 && p < 1)) throw std::invalid_argument(fmt::format("Dropout: p = {} must be in [0, 1)", p));
}

std::uint64_t dropout_seed(std::uint64_t seed, std::uint64_t step, std::uint64_t index) {
  auto mix = [](std::uint64_t z) {  // SplitMix64's finaliser (Steele et al. 2014)
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  // The constant separates dropout's streams from Rng(seed) itself (the initialisation).
  return mix(mix(mix(seed ^ 0x64726f706f7574ULL) + step) + index);
}

}  // namespace tapegrad::nn
