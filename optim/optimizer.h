// Optimizer: the base of SGD and AdamW. It holds the parameters, one set of per-parameter state
// tensors ("slots", e.g. AdamW's m and v) and the step count, and exports and restores that state
// under checkpoint names "optim.<parameter name>.<slot>" (the "optim." tensors of a training checkpoint).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/parameter.h"
#include "core/tensor.h"

namespace tapegrad::optim {

/// One exported state tensor under its checkpoint name.
struct NamedTensor {
  std::string name;  ///< e.g. "optim.blocks.0.attn.wq.weight.m"
  Tensor value;      ///< the slot's values, of its parameter's shape
};

/// Everything an optimizer needs to continue bit-identically: its slot tensors and the number of
/// steps taken (kept apart from the tensors because a float cannot count past 2^24 exactly).
struct OptimizerState {
  std::vector<NamedTensor> tensors;  ///< every slot of every parameter, in params() order
  std::int64_t step = 0;             ///< steps taken
};

/// The base of the optimizers: parameters, per-parameter state tensors, the step count.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter that has a gradient, at the current lr; bumps their versions
  /// (so a KV cache filled under the old weights refuses to step). Parameters without a gradient
  /// are left alone, state included, as in PyTorch.
  virtual void step() = 0;
  /// Drops every parameter's gradient (the next backward starts from zero).
  void zero_grad();

  /// The learning rate of the next step (a schedule sets it before every step).
  void set_lr(float lr);
  /// The learning rate the next step will use.
  float lr() const { return lr_; }
  /// Steps taken so far (the t of the next step's bias correction is steps() + 1).
  std::int64_t steps() const { return step_; }
  /// The parameters, in the order given (which is also the order of state()).
  const ParameterList& params() const { return params_; }
  /// "SGD" or "AdamW": used in error messages.
  const char* name() const { return name_; }

  /// Copies of the slot tensors, parameter by parameter in params() order, slot by slot, under
  /// "optim.<parameter name>.<slot>", and the step count.
  OptimizerState state() const;
  /// Restores a state(): every expected name must appear once with its parameter's shape and
  /// values the optimizer could have produced (finite; AdamW's v >= 0), and no other name may
  /// appear; the first problem throws std::invalid_argument naming the tensor, and nothing is
  /// changed unless the whole state is valid.
  void load_state(const OptimizerState& state);
  /// The checkpoint name of a slot: "optim.<parameter name>.<slot>".
  static std::string state_name(const std::string& parameter, const std::string& slot);

 protected:
  /// params must have distinct names and defined values; every slot starts as zeros of its
  /// parameter's shape. name is a string literal ("AdamW").
  Optimizer(const char* name, ParameterList params, std::vector<std::string> slot_names, float lr);

  /// The parameters, for the update of step().
  ParameterList& mutable_params() { return params_; }
  /// The state tensor of slot `slot` for parameter i (same shape as the parameter).
  Tensor& slot(std::size_t i, std::size_t slot) { return slots_[i][slot]; }
  /// Why the value of an element of slot `slot` cannot be this optimizer's state, or null if it
  /// can. The base accepts every finite value.
  virtual const char* invalid_slot_value(std::size_t slot, float value) const;
  /// Counts a step taken and returns its number t (1 for the first step).
  std::int64_t advance_step() { return ++step_; }
  /// Whether decoupled weight decay applies to a parameter: matrices (rank >= 2: embedding,
  /// projections, head weight) only, never norm weights or biases, unless decay_all is set.
  static bool decays(const NamedParameter& p, bool decay_all) { return decay_all || p.var.shape().size() >= 2; }

 private:
  const char* name_;
  ParameterList params_;
  std::vector<std::string> slot_names_;
  std::vector<std::vector<Tensor>> slots_;  // [parameter][slot], each of the parameter's shape
  float lr_;
  std::int64_t step_ = 0;
};

namespace detail {
/// Throws std::invalid_argument "<optimizer>: <what> must be <rule>, got <value>" unless ok.
void check_hyperparameter(const char* optimizer, const char* what, double value, bool ok, const char* rule);
}  // namespace detail

}  // namespace tapegrad::optim
