// A SIMD batch emulated with plain lanes: the batch of the emulated16 test level (16 floats,
// AVX-512's width; core/kernels/level.h), and of the tests that run the width-generic helpers of
// core/kernels/simd_helpers.h at other widths. Each lane is computed as scalar code would, so a
// kernel's lane-order, tail or position mistake at 16 lanes shows on any AVX2 machine (the level is
// compiled for AVX2 with FMA; the helper tests compile it for any x86-64).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>

namespace tapegrad::kernels {

template <class T, std::size_t N> struct EmulatedBatch {
  using value_type = T;
  static constexpr std::size_t size = N;
  T lane[N];

  EmulatedBatch() = default;
  EmulatedBatch(T value) {  // NOLINT: implicit, as xsimd's broadcast
    for (T& x : lane) x = value;
  }
  static EmulatedBatch load_unaligned(const T* p) {
    EmulatedBatch b;
    for (std::size_t i = 0; i < N; ++i) b.lane[i] = p[i];
    return b;
  }
  static EmulatedBatch load_aligned(const T* p) {
    return check_aligned(reinterpret_cast<std::uintptr_t>(p)), load_unaligned(p);
  }
  void store_unaligned(T* p) const {
    for (std::size_t i = 0; i < N; ++i) p[i] = lane[i];
  }
  void store_aligned(T* p) const { check_aligned(reinterpret_cast<std::uintptr_t>(p)), store_unaligned(p); }

  // Aligned loads and stores of a real batch of N * sizeof(T) bytes fault when misaligned. (The
  // address as a number: given a pointer to const, GCC 12 took a store to a fresh array for a read
  // of it, and warned.)
  static void check_aligned(std::uintptr_t address) {
    constexpr std::size_t bytes = N * sizeof(T) < 64 ? N * sizeof(T) : 64;
    if (address % bytes != 0) throw std::logic_error("EmulatedBatch: misaligned access");
  }

  template <class F> friend EmulatedBatch lanewise(const EmulatedBatch& a, const EmulatedBatch& b, F f) {
    EmulatedBatch r;
    for (std::size_t i = 0; i < N; ++i) r.lane[i] = f(a.lane[i], b.lane[i]);
    return r;
  }
  friend EmulatedBatch operator+(const EmulatedBatch& a, const EmulatedBatch& b) {
    return lanewise(a, b, [](T x, T y) { return x + y; });
  }
  friend EmulatedBatch operator-(const EmulatedBatch& a, const EmulatedBatch& b) {
    return lanewise(a, b, [](T x, T y) { return x - y; });
  }
  friend EmulatedBatch operator*(const EmulatedBatch& a, const EmulatedBatch& b) {
    return lanewise(a, b, [](T x, T y) { return x * y; });
  }
  friend EmulatedBatch operator/(const EmulatedBatch& a, const EmulatedBatch& b) {
    return lanewise(a, b, [](T x, T y) { return x / y; });
  }
  friend EmulatedBatch operator-(const EmulatedBatch& a) { return EmulatedBatch(T(0)) - a; }
  EmulatedBatch& operator+=(const EmulatedBatch& b) { return *this = *this + b; }
  EmulatedBatch& operator*=(const EmulatedBatch& b) { return *this = *this * b; }

  friend EmulatedBatch fma(const EmulatedBatch& a, const EmulatedBatch& b, const EmulatedBatch& c) {
    EmulatedBatch r;
    for (std::size_t i = 0; i < N; ++i) r.lane[i] = std::fma(a.lane[i], b.lane[i], c.lane[i]);
    return r;
  }
  friend EmulatedBatch max(const EmulatedBatch& a, const EmulatedBatch& b) {
    return lanewise(a, b, [](T x, T y) { return x < y ? y : x; });
  }
  friend EmulatedBatch exp(const EmulatedBatch& a) {
    EmulatedBatch r;
    for (std::size_t i = 0; i < N; ++i) r.lane[i] = std::exp(a.lane[i]);
    return r;
  }
  friend EmulatedBatch sqrt(const EmulatedBatch& a) {  // correctly rounded, as every level's
    EmulatedBatch r;
    for (std::size_t i = 0; i < N; ++i) r.lane[i] = std::sqrt(a.lane[i]);
    return r;
  }
  friend T hadd(const EmulatedBatch& a) {
    T sum = 0;
    for (T x : a.lane) sum += x;
    return sum;
  }
};

}  // namespace tapegrad::kernels
