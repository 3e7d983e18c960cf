// Module: something with named parameters and child modules, each named once, in members().
// params(), train() / eval() and save / load (nn/module_io.h) all walk members(), so that no
// module can list a child in one place and forget it in another. Modules compose core ops and
// write no backward of their own; their parameters are leaves that optimizers update in place.
#pragma once

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/parameter.h"
#include "core/random.h"

namespace tapegrad::nn {

class Module;

/// What Module::members() calls, once per member and in a fixed order: m("weight", weight) for a
/// parameter (an undefined Var, such as an absent bias, is skipped), m("attn.wq", wq) for a child
/// module, m("blocks", blocks) for a vector of children ("blocks.0", "blocks.1", ...).
class Members {
 public:
  virtual void operator()(std::string_view name, Var& parameter) = 0;  ///< A parameter.
  virtual void operator()(std::string_view name, Module& child) = 0;    ///< A child module.
  /// Each child under name.index.
  template <std::derived_from<Module> Child>
  void operator()(std::string_view name, std::vector<Child>& children) {
    for (std::size_t i = 0; i < children.size(); ++i) (*this)(std::string(name) + "." + std::to_string(i), children[i]);
  }

 protected:
  ~Members() = default;
};

/// The base of every layer and model: named parameters and children, and a training/evaluation mode.
class Module {
 public:
  virtual ~Module() = default;
  /// Names every parameter and child module once, in a fixed order (checkpoints store the names,
  /// optimizer states follow the order): m("weight", weight); m("drop", drop); ...
  virtual void members(Members& m) = 0;

  /// Every parameter with its dotted name ("blocks.0.attn.wq.weight"), in members() order.
  ParameterList params() const;
  /// The number of values (every parameter's size, added up, frozen ones included).
  std::size_t num_params() const;
  /// Every parameter stops requiring a gradient (a frozen base, as torch's requires_grad_(False)):
  /// backward computes none for it, and optimizers refuse it (take trainable(params())).
  void freeze();

  /// Training mode (the default) or evaluation mode, as torch's train() / eval(), for this module
  /// and every module under it: it switches dropout.
  void train(bool on = true);
  void eval() { train(false); }                 ///< Evaluation mode: dropout off.
  bool training() const { return training_; }  ///< Whether the module is in training mode.

 private:
  bool training_ = true;
};

/// A trainable leaf of the given shape, zero-filled (modules initialise it); inside a
/// SkipInitScope left unfilled, for a loader that assigns every value.
inline Var parameter(Shape shape) {
  // Untouched, the pages of a matrix that a loader replaces by packed blocks never become resident.
  return Var(SkipInitScope::active() ? Tensor::uninitialized(std::move(shape)) : Tensor(std::move(shape)),
             /*requires_grad=*/true);
}

}  // namespace tapegrad::nn
