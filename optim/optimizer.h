// Optimizer: the base of SGD and AdamW. It holds the parameters, per-parameter state ("slots",
// e.g. AdamW's m and v; all of it, or one rank's shard) and the step count, and exports and restores that state
// under checkpoint names "optim.<parameter name>.<slot>" (the "optim." tensors of a training checkpoint).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
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

/// Elements [begin, end) of the parameters laid end to end in params() order (the "flat" order).
struct FlatRange {
  std::size_t begin = 0;  ///< the first element
  std::size_t end = 0;    ///< one past the last element
  std::size_t size() const { return end - begin; }  ///< end - begin
};

/// The part of one parameter inside a FlatRange.
struct ParameterPiece {
  std::size_t parameter;  ///< its index in the parameter list
  std::size_t begin;      ///< its first element inside the range, counted from the parameter's start
  std::size_t count;      ///< how many of its elements are inside (at least 1)
  std::size_t flat;       ///< that first element's place in the flat order
};
/// The parameters' pieces inside range, in order (parameters outside it are left out).
std::vector<ParameterPiece> pieces_in(const ParameterList& params, FlatRange range);
/// The number of elements of all parameters together.
std::size_t flat_size(const ParameterList& params);

/// The base of the optimizers: parameters, per-parameter state tensors, the step count.
///
/// ZeRO-1 (Rajbhandari et al. 2020): after keep_only(range), the optimizer keeps the state of, and
/// step() updates, only the elements of that range of the flat order; another rank holds the
/// rest, and the caller shares the updated parameters. Every element is updated by the same float
/// operations as without sharding, so the results are bit-identical.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter that has a gradient, at the current lr; bumps their versions
  /// (so a KV cache filled under the old weights refuses to step). Parameters without a gradient
  /// are left alone, state included, as in PyTorch.
  virtual void step() = 0;
  /// step() as if every gradient were first multiplied by grad_scale (a float product, as
  /// clip_grad_norm's scaling): clipping folded into the update (see clip_grad_norm_and_step). The
  /// base scales the gradients in place, then steps; an optimizer may instead scale each gradient as
  /// it reads it and leave the gradients unscaled (AdamW does). Either way, zero_grad comes next.
  virtual void step_scaled(float grad_scale);
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
  /// "optim.<parameter name>.<slot>", and the step count. Throws std::logic_error after
  /// keep_only (the state is then in pieces: use the overload with a gather).
  OptimizerState state() const;
  /// Given the held values of one slot (held().size() floats), returns that slot's values of all
  /// flat_size(params()) elements in flat order: every rank's piece, put together.
  using GatherSlot = std::function<std::vector<float>(std::span<const float> held)>;
  /// state() of an optimizer that may keep only a range: each slot put together by gather.
  OptimizerState state(const GatherSlot& gather) const;
  /// Restores a state(): every expected name must appear once with its parameter's shape and
  /// values the optimizer could have produced (finite; AdamW's v >= 0), and no other name may
  /// appear; the first problem throws std::invalid_argument naming the tensor, and nothing is
  /// changed unless the whole state is valid. After keep_only, only the held range is kept.
  void load_state(const OptimizerState& state);

  /// Keeps the state of, and from now on updates, only the elements of range (within held()),
  /// freeing the rest: the sharded optimizer state of ZeRO-1. Throws std::invalid_argument for
  /// a range outside held().
  void keep_only(FlatRange range);
  /// The flat range whose state this optimizer keeps: all elements unless keep_only was called.
  FlatRange held() const { return held_; }
  /// Bytes of state kept (every slot over held()): the optimizer's memory.
  std::size_t state_bytes() const { return slot_names_.size() * held_.size() * sizeof(float); }
  /// The checkpoint name of a slot: "optim.<parameter name>.<slot>".
  static std::string state_name(const std::string& parameter, const std::string& slot);

 protected:
  /// params must have distinct names and defined values, none frozen (std::invalid_argument
  /// otherwise: pass trainable(params)); every slot starts as zeros of its
  /// parameter's shape. name is a string literal ("AdamW").
  Optimizer(const char* name, ParameterList params, std::vector<std::string> slot_names, float lr);

  /// The parameters, for the update of step().
  ParameterList& mutable_params() { return params_; }
  /// The part of parameter i that step() updates: its elements [begin, begin + count) (count 0
  /// when none is held).
  struct Held {
    std::size_t begin = 0;  ///< the first element held, counted from the parameter's start
    std::size_t count = 0;  ///< how many elements are held
  };
  /// Parameter i's held part.
  Held held_part(std::size_t i) const { return held_parts_[i]; }
  /// The state of slot `slot` for parameter i's held part (held_part(i).count floats).
  float* slot(std::size_t i, std::size_t slot) { return slots_[slot].data() + slot_offsets_[i]; }
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
  void hold(FlatRange range);  // sets held_ and each parameter's held part and slot offset
  // state() from each slot's values over all elements in flat order, asked for slot by slot.
  OptimizerState state_of_slots(const std::function<std::span<const float>(std::size_t slot)>& slot_values) const;

  std::vector<std::string> slot_names_;
  FlatRange held_;
  std::vector<std::vector<float>> slots_;   // [slot][element of held_]
  std::vector<Held> held_parts_;            // [parameter]
  std::vector<std::size_t> slot_offsets_;   // [parameter]: its held part's place in a slot
  float lr_;
  std::int64_t step_ = 0;
};

namespace detail {
/// Throws std::invalid_argument "<optimizer>: <what> must be <rule>, got <value>" unless ok.
void check_hyperparameter(const char* optimizer, const char* what, double value, bool ok, const char* rule);
}  // namespace detail

}  // namespace tapegrad::optim
