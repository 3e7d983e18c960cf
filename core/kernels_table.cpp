// This SIMD level's KernelTable (core/kernel_table.h): the kernels of the other kernels_*.cpp
// files as compiled for TAPEGRAD_SIMD_LEVEL.
#include "core/kernel_level.h"

namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL {

template <class T> const KernelTable<T>& table() {
  static const KernelTable<T> kernels{
      .gemm = &gemm<T>,
      .packed_gemm = &packed_gemm<T>,
      .row_stable_matmul = &row_stable_matmul<T>,
      .add_forward = &add_forward<T>,
      .accumulate = &accumulate<T>,
      .mul_forward = &mul_forward<T>,
      .mul_backward = &mul_backward<T>,
      .scale_forward = &scale_forward<T>,
      .scale_backward = &scale_backward<T>,
      .add_bias_forward = &add_bias_forward<T>,
      .add_bias_backward = &add_bias_backward<T>,
      .embedding_forward = &embedding_forward<T>,
      .embedding_backward = &embedding_backward<T>,
      .rms_norm_forward = &rms_norm_forward<T>,
      .rms_norm_backward = &rms_norm_backward<T>,
      .layer_norm_forward = &layer_norm_forward<T>,
      .layer_norm_backward = &layer_norm_backward<T>,
      .rope_forward = &rope_forward<T>,
      .rope_backward = &rope_backward<T>,
      .silu_forward = &silu_forward<T>,
      .silu_backward = &silu_backward<T>,
      .swiglu_forward = &swiglu_forward<T>,
      .swiglu_backward = &swiglu_backward<T>,
      .gelu_tanh_forward = &gelu_tanh_forward<T>,
      .gelu_tanh_backward = &gelu_tanh_backward<T>,
      .attention_forward = &attention_forward<T>,
      .attention_backward = &attention_backward<T>,
      .cached_attention_forward = &cached_attention_forward<T>,
      .cross_entropy_forward = &cross_entropy_forward<T>,
      .cross_entropy_backward = &cross_entropy_backward<T>,
  };
  return kernels;
}

template const KernelTable<float>& table<float>();
template const KernelTable<double>& table<double>();

}  // namespace tapegrad::kernels::TAPEGRAD_SIMD_LEVEL
