// Private to core/: run-time dispatch of the kernels. Every core/kernels_*.cpp file is compiled
// once per SIMD level (core/simd.h), with that level's compiler flags, into namespace
// kernels::<level>; each level fills one KernelTable, and the public kernels (core/kernels.cpp)
// call through the table of the level in use. The build makes every other symbol of a level's
// objects local (CMakeLists.txt), so code compiled for AVX-512 is never linked into another level.
#pragma once

#include "core/kernels.h"
#include "core/simd.h"

namespace tapegrad::kernels {

template <class T> struct KernelTable {
  decltype(&gemm<T>) gemm;
  decltype(&packed_gemm<T>) packed_gemm;
  decltype(&row_stable_matmul<T>) row_stable_matmul;
  decltype(&add_forward<T>) add_forward;
  decltype(&accumulate<T>) accumulate;
  decltype(&mul_forward<T>) mul_forward;
  decltype(&mul_backward<T>) mul_backward;
  decltype(&scale_forward<T>) scale_forward;
  decltype(&scale_backward<T>) scale_backward;
  decltype(&add_bias_forward<T>) add_bias_forward;
  decltype(&add_bias_backward<T>) add_bias_backward;
  decltype(&embedding_forward<T>) embedding_forward;
  decltype(&embedding_backward<T>) embedding_backward;
  decltype(&rms_norm_forward<T>) rms_norm_forward;
  decltype(&rms_norm_backward<T>) rms_norm_backward;
  decltype(&layer_norm_forward<T>) layer_norm_forward;
  decltype(&layer_norm_backward<T>) layer_norm_backward;
  decltype(&rope_forward<T>) rope_forward;
  decltype(&rope_backward<T>) rope_backward;
  decltype(&silu_forward<T>) silu_forward;
  decltype(&silu_backward<T>) silu_backward;
  decltype(&swiglu_forward<T>) swiglu_forward;
  decltype(&swiglu_backward<T>) swiglu_backward;
  decltype(&gelu_tanh_forward<T>) gelu_tanh_forward;
  decltype(&gelu_tanh_backward<T>) gelu_tanh_backward;
  decltype(&attention_forward<T>) attention_forward;
  decltype(&attention_backward<T>) attention_backward;
  decltype(&cached_attention_forward<T>) cached_attention_forward;
  decltype(&cross_entropy_forward<T>) cross_entropy_forward;
  decltype(&cross_entropy_backward<T>) cross_entropy_backward;
};

namespace sse2 { template <class T> const KernelTable<T>& table(); }
namespace avx2 { template <class T> const KernelTable<T>& table(); }
namespace avx512 { template <class T> const KernelTable<T>& table(); }
namespace emulated16 { template <class T> const KernelTable<T>& table(); }  // in builds with the tests

/// The table of the level in use (float and double).
template <class T> const KernelTable<T>& active_table();

}  // namespace tapegrad::kernels
