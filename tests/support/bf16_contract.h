// bf16_gemm's contract (Note [bf16 products], core/kernels/matmul_bf16.cpp) written out as plain
// scalar code, for the tests of bf16_gemm and of the packed BF16 kernel.
#pragma once

#include <cmath>
#include <cstddef>

#include "core/bf16.h"

namespace tapegrad::test {

// x rounded to float, its exponent unbounded, then flushed to a zero of its sign below 2^-126:
// the contract's rounding of every step and sum.
inline float rounded_and_flushed(double x) {
  if (!(std::fabs(x) < 0x1p-100)) return float(x);
  const float scaled = float(x * 0x1p100);  // exact in double; a normal float
  return std::fabs(scaled) < 0x1p-26f ? std::copysign(0.0f, scaled) : scaled * 0x1p-100f;
}

// A bf16 operand as the paths read it: rounded, a subnormal read as a zero of its sign.
inline float bf16_operand_value(float x) {
  const float rounded = round_to_bf16(x);
  return std::fabs(rounded) < 0x1p-126f ? std::copysign(0.0f, rounded) : rounded;
}

// The contract for one output c of sum_k a(k) b(k), k < K: blocks of 32 k from k = 0
// (zero-padded), per block a chain over the even k and one over the odd k from +0, S = E + O,
// c = c + S (a subnormal c read as zero), c starting at `c`. Exact for finite operands whose
// products fit a double (the double sum rounds innocuously).
template <class A, class B>
float bf16_contract(std::size_t K, A a, B b, float c) {
  auto step = [&](float acc, std::size_t k) {
    if (k >= K) return rounded_and_flushed(double(acc) + 0.0);
    return rounded_and_flushed(double(acc) + double(bf16_operand_value(a(k))) * double(bf16_operand_value(b(k))));
  };
  for (std::size_t k0 = 0; k0 < K; k0 += 32) {
    float even = 0.0f, odd = 0.0f;
    for (std::size_t k = k0; k < k0 + 32; k += 2) even = step(even, k), odd = step(odd, k + 1);
    const float sum = rounded_and_flushed(double(even) + double(odd));
    c = rounded_and_flushed(double(std::fabs(c) < 0x1p-126f ? std::copysign(0.0f, c) : c) + double(sum));
  }
  return c;
}

}  // namespace tapegrad::test
