// The thread's matmul precision and its scope (core/precision.h).
#include "core/precision.h"

#include <fmt/format.h>

#include <stdexcept>

namespace tapegrad {

namespace {
thread_local Precision current_precision = Precision::f32;
}

std::string_view precision_name(Precision precision) { return precision == Precision::bf16 ? "bf16" : "f32"; }

Precision parse_precision(std::string_view name) {
  if (name == "f32") return Precision::f32;
  if (name == "bf16") return Precision::bf16;
  throw std::invalid_argument(fmt::format("precision: unknown '{}'; use f32 or bf16", name));
}

Precision matmul_precision() { return current_precision; }

PrecisionScope::PrecisionScope(Precision precision) : saved_(current_precision) { current_precision = precision; }
PrecisionScope::~PrecisionScope() { current_precision = saved_; }

}  // namespace tapegrad
