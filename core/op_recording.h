// The one way a differentiable op is recorded, used by the built-in ops (core/ops*.cpp) and by
// users' own ops alike (Flashlight's `Variable(result, {inputs...}, gradFunc)`): Op holds the
// boilerplate (which tape, stale inputs, which inputs need a gradient, bytes saved), the op
// supplies its forward value and a backward closure capturing what it saves.
//
// A custom op in a few lines (tests/core/test_custom_op.cpp defines one outside core/):
//
//   /// y = x^3; saves x.
//   Var cube(const Var& x) {
//     Op op("cube", {x});
//     Tensor y(x.shape());
//     for (std::size_t i = 0; i < y.size(); ++i) y[i] = x.value()[i] * x.value()[i] * x.value()[i];
//     // dx += 3 x^2 dy
//     return op.finish(std::move(y), [x](const Tensor& dy, const Tensor&) {
//       if (float* dx = grad_ptr(x))
//         for (std::size_t i = 0; i < dy.size(); ++i) dx[i] += 3 * x.value()[i] * x.value()[i] * dy[i];
//     });
//   }
//
// Rules for a backward: only accumulate (+=) into the gradients of inputs (grad_ptr returns null
// for an input that needs none), or write (=) a whole gradient through a grad_target that says
// overwrite; never record on the tape; never change what was saved. Capture inputs by value (a Var
// is a shared handle) and save only what the backward reads. The inputs' versions are recorded
// here, so a backward whose input was since changed in place (Var::mutable_value) is refused by
// the tape.
#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <span>
#include <vector>

#include "core/tape.h"

namespace tapegrad {

/// The tape to record on: the current one if any input needs a gradient, else null. Throws when
/// an input was made on a tape that has since been cleared or spent (its graph is gone).
Tape* recording_tape(const char* op, std::initializer_list<const Var*> inputs);

/// x's gradient buffer (zeros on first use), or null when x needs no gradient.
Tensor* grad_if_needed(const Var& x);
/// n's gradient buffer (zeros on first use), or null when n needs no gradient.
Tensor* grad_if_needed(Node& n);
/// x's gradient as a raw pointer for kernels (zeros on first use), or null when x needs none.
float* grad_ptr(const Var& x);

/// Where a backward puts an input's gradient when its kernel can either add or write.
struct GradTarget {
  float* data = nullptr;  ///< the gradient buffer, or null when the input needs no gradient
  /// No gradient has reached the input yet: the buffer holds no values (it is not zero-filled),
  /// and the kernel must write (=) every element rather than add. Otherwise it adds, as to grad_ptr.
  bool overwrite = false;
};
/// x's gradient for a kernel that writes it whole: an overwrite target skips the zero-fill and the
/// read of those zeros (the first gradient of every activation). Take it just before the kernel
/// that writes it: a second call for the same input adds.
GradTarget grad_target(const Var& x);
/// grad_target(x) when x is none of the op's other inputs; otherwise an adding target (never
/// overwrite), since the same buffer then also takes those inputs' gradients.
GradTarget grad_target(const Var& x, std::initializer_list<Var> others);
/// Makes `gradient` (x's shape) x's gradient without a copy when none has reached x yet, and returns
/// true (`gradient` is left empty); returns false, leaving it, when x needs no gradient or already
/// has one. For a gradient made ahead of backward (linear_cross_entropy's weight: 113 MB at
/// SmolLM2's size), so that it is not held twice.
bool adopt_grad(const Var& x, Tensor& gradient);
/// One overwrite flag for a kernel that writes several inputs' gradients of `size` floats at once:
/// true when every target that is there says overwrite; otherwise those that do are zero-filled
/// and false is returned, so that the kernel adds into all of them.
bool overwrite_all(std::initializer_list<GradTarget> targets, std::size_t size);
/// n's gradient as a raw pointer for kernels (zeros on first use), or null when n needs none.
float* grad_ptr(Node& n);

/// The shape a and b broadcast to under numpy's rules (align the trailing axes; each pair of
/// sizes must be equal or contain a 1). Throws "<op>: cannot broadcast a [..] with b [..]".
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
/// True when x broadcasts to shape (shape's rank at least x's; each of x's sizes 1 or equal).
bool broadcastable_to(const Shape& x, const Shape& shape);
/// x's values repeated along the axes where x has size 1 (or is missing) to fill shape.
Tensor expand_to(const Tensor& x, const Shape& shape);
/// The gradient of a broadcast: g (of a broadcast shape) summed over the axes that broadcasting
/// added or stretched, giving shape (Flashlight's sumAs). The one place broadcasts are undone.
Tensor sum_to(const Tensor& g, const Shape& shape);
/// x.grad += sum_to(g, x.shape()) when x needs a gradient: how a backward hands a gradient of
/// the output's (possibly broadcast) shape to an input.
void accumulate_grad(const Var& x, const Tensor& g);

/// axis in [-rank, rank) as an index in [0, rank); throws "<op>: axis a is out of range for x [..]".
std::size_t axis_index(const char* op, int axis, const Shape& shape);
/// The sizes before, at and after an axis: x viewed as (outer, n, inner).
struct AxisSplit {
  std::size_t outer;  ///< the product of the sizes before the axis
  std::size_t n;      ///< the axis's size
  std::size_t inner;  ///< the product of the sizes after the axis
};
/// shape viewed as (outer, n, inner) around axis.
AxisSplit split_at_axis(const Shape& shape, std::size_t axis);

/// One op's recording. Construct it with the op's name and inputs before the forward; call
/// finish(value, backward) to get the output. Under a NoGradScope, outside a Tape, or when no
/// input needs a gradient, finish records nothing and backward is dropped.
class Op {
 public:
  /// backward(dy, y): dy is d loss / d output, y the output value (for ops whose derivative is
  /// cheapest in terms of their output: exp, tanh, sigmoid, softmax).
  using Backward = std::function<void(const Tensor& dy, const Tensor& y)>;

  /// Starts the recording of op `name` (a string literal) on inputs; throws when an input was
  /// made on a tape that has since been cleared or spent.
  Op(const char* name, std::initializer_list<Var> inputs);
  /// The same for ops of any number of inputs (cat).
  Op(const char* name, const std::vector<Var>& inputs);
  /// True when finish will record: check it before saving anything expensive for backward.
  bool recording() const { return tape_ != nullptr; }
  /// The op's name, for error messages.
  const char* name() const { return name_; }
  /// The output Var holding value; records backward (with saved_bytes counted as kept alive)
  /// when recording().
  Var finish(Tensor value, Backward backward, std::size_t saved_bytes = 0);

 private:
  void record_versions(std::span<const Var> inputs);

  const char* name_;
  Tape* tape_ = nullptr;
  std::vector<RecordedInput> inputs_;  // their versions, checked before the backward runs
};

}  // namespace tapegrad
