// Module: something with named parameters. Modules compose core ops and write no backward of
// their own; their parameters are leaves that optimizers update in place.
#pragma once

#include <cstddef>
#include <string>

#include "core/parameter.h"

namespace tapegrad::nn {

class Module {
 public:
  virtual ~Module() = default;
  /// Every parameter with its dotted name (SPEC section 5), in a fixed order.
  ParameterList params() const {
    ParameterList out;
    collect_params("", out);
    return out;
  }
  std::size_t num_params() const {
    std::size_t n = 0;
    for (const auto& p : params()) n += p.var.value().size();
    return n;
  }
  /// Appends this module's parameters, their names prefixed by prefix ("blocks.0.").
  virtual void collect_params(const std::string& prefix, ParameterList& out) const = 0;

  /// Training mode (the default) or evaluation mode, as torch's train() / eval(): it switches
  /// dropout. A module with children passes the mode on to them in set_training.
  void train(bool on = true) { set_training(on); }
  void eval() { set_training(false); }
  bool training() const { return training_; }
  virtual void set_training(bool on) { training_ = on; }

 private:
  bool training_ = true;
};

/// A trainable leaf of the given shape, zero-filled (modules initialise it).
inline Var parameter(Shape shape) { return Var(Tensor(std::move(shape)), /*requires_grad=*/true); }

}  // namespace tapegrad::nn
