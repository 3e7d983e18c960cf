// xoshiro256** with splitmix64 seeding, and the distributions built on it.
#include "core/random.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <sstream>
#include <stdexcept>

#include "core/tensor.h"

namespace tapegrad {

static std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

Rng::Rng(std::uint64_t seed) {
  for (auto& word : s_) word = splitmix64(seed);
}

std::uint64_t Rng::next_u64() {
  std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

float Rng::uniform() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }

std::uint64_t Rng::below(std::uint64_t n) {
  if (n == 0) throw std::invalid_argument("Rng::below: n must be positive");
  std::uint64_t limit = -n % n;  // 2^64 mod n: values below it would bias the low residues
  for (;;) {
    std::uint64_t x = next_u64();
    if (x >= limit) return x % n;
  }
}

float Rng::normal() {
  // u1 in (0, 1] so that log(u1) is finite.
  double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * 0x1.0p-53;
  double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

std::size_t Rng::categorical(const float* weights, std::size_t count) {
  if (count == 0) throw std::invalid_argument("Rng::categorical: no categories");
  double total = 0;
  for (std::size_t i = 0; i < count; ++i) total += weights[i];
  if (!(total > 0) || !std::isfinite(total))
    throw std::invalid_argument(fmt::format("Rng::categorical: weights sum to {}", total));
  double target = static_cast<double>(next_u64() >> 11) * 0x1.0p-53 * total;
  double running = 0;
  std::size_t last_positive = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (weights[i] <= 0) continue;
    last_positive = i;
    running += weights[i];
    if (target < running) return i;
  }
  return last_positive;  // rounding left target at the very top
}

namespace {
thread_local int skip_init_depth = 0;
}  // namespace

SkipInitScope::SkipInitScope() { ++skip_init_depth; }
SkipInitScope::~SkipInitScope() { --skip_init_depth; }
bool SkipInitScope::active() { return skip_init_depth > 0; }

void Rng::fill_normal(Tensor& t, float stddev) {
  if (SkipInitScope::active()) return;
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = normal() * stddev;
}

std::string Rng::state() const { return fmt::format("{} {} {} {}", s_[0], s_[1], s_[2], s_[3]); }

void Rng::set_state(const std::string& text) {
  std::istringstream in(text);
  std::array<std::uint64_t, 4> s{};
  for (auto& word : s)
    if (!(in >> word)) throw std::invalid_argument(fmt::format("Rng::set_state: malformed state '{}'", text));
  std::string rest;
  if (in >> rest) throw std::invalid_argument(fmt::format("Rng::set_state: malformed state '{}'", text));
  if ((s[0] | s[1] | s[2] | s[3]) == 0) throw std::invalid_argument("Rng::set_state: the all-zero state is invalid");
  s_ = s;
}

}  // namespace tapegrad
