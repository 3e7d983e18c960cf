// The precision of float matrix products: float32, or bfloat16 inputs with float32 accumulation
// (mixed precision: weights, gradients and optimizer state stay float32; only the products' inputs
// are rounded). A thread-local setting that a PrecisionScope changes, as torch.autocast does.
#pragma once

#include <string_view>

namespace tapegrad {

/// How matrix products treat their float inputs.
enum class Precision {
  f32,   ///< float32 inputs and accumulation
  bf16,  ///< inputs rounded to bfloat16 (nearest even), float32 accumulation: kernels::bf16_gemm
};

/// "f32" or "bf16".
std::string_view precision_name(Precision precision);
/// The Precision named "f32" or "bf16"; throws std::invalid_argument naming the value otherwise.
Precision parse_precision(std::string_view name);

/// The precision of this thread's matrix products: f32 unless a PrecisionScope is open. The matmul
/// ops read it when they run forward and keep it for their backward (so a backward computed outside
/// the scope still matches its forward); remat's re-run forward reads it again, so open the scope
/// around the whole step, forward and backward.
Precision matmul_precision();

/// Sets this thread's matmul precision while it lives, and restores the previous one (nests).
class PrecisionScope {
 public:
  /// Sets `precision` for this thread's matmuls.
  explicit PrecisionScope(Precision precision);
  ~PrecisionScope();  ///< Restores the precision that was set before.
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  Precision saved_;
};

}  // namespace tapegrad
