// Module: something with named parameters. Modules compose core ops and write no backward of
// their own; their parameters are leaves that optimizers update in place.
#pragma once

#include <cstddef>
#include <string>

#include "core/parameter.h"

namespace tapegrad::nn {

/// The base of every layer and model: named parameters and a training/evaluation mode.
class Module {
 public:
  virtual ~Module() = default;
  /// Every parameter with its dotted name ("blocks.0.attn.wq.weight"), in a fixed order.
  ParameterList params() const {
    ParameterList out;
    collect_params("", out);
    return out;
  }
  /// The number of trainable values (every parameter's size, added up).
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
  void eval() { set_training(false); }              ///< Evaluation mode: dropout off.
  bool training() const { return training_; }       ///< Whether the module is in training mode.
  virtual void set_training(bool on) { training_ = on; }  ///< Sets the mode (and the children's).

 private:
  bool training_ = true;
};

/// A trainable leaf of the given shape, zero-filled (modules initialise it).
inline Var parameter(Shape shape) { return Var(Tensor(std::move(shape)), /*requires_grad=*/true); }

}  // namespace tapegrad::nn
