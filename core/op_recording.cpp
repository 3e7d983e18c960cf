// Op recording, gradient helpers and the broadcast machinery (expand_to / sum_to).
#include "core/op_recording.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace tapegrad {

namespace {

// The one liveness and requires-grad check, for recording_tape and Op.
// Without a tape, the leaves read are noted for a rematerialised block's entry (LeafReads).
template <class Range, class Get>
Tape* tape_for(const char* op, const Range& inputs, Get var_of) {
  Tape* tape = Tape::current();
  if (!tape) {
    for (const auto& v : inputs) LeafReads::note(var_of(v));
    return nullptr;
  }
  bool any = false;
  for (const auto& v : inputs) {
    const Node& n = var_of(v).node();
    if (n.tape && !tape_value_is_live(n))
      throw std::logic_error(fmt::format("{}: an input of shape {} was computed on a tape that has since been "
                                         "cleared or spent; recompute it on the current tape",
                                         op, to_string(n.value.shape())));
    any = any || n.requires_grad;
  }
  return any ? tape : nullptr;
}

}  // namespace

Tape* recording_tape(const char* op, std::initializer_list<const Var*> inputs) {
  return tape_for(op, inputs, [](const Var* v) -> const Var& { return *v; });
}

Tensor* grad_if_needed(Node& n) {
  if (!n.requires_grad) return nullptr;
  if (n.grad.empty()) n.grad = Tensor(n.value.shape());
  return &n.grad;
}
Tensor* grad_if_needed(const Var& x) { return grad_if_needed(x.gradient_node()); }

float* grad_ptr(Node& n) {
  Tensor* g = grad_if_needed(n);
  return g ? g->data() : nullptr;
}
GradTarget grad_target(const Var& x) {
  Node& n = x.gradient_node();
  if (!n.requires_grad) return {};
  if (!n.grad.empty()) return {n.grad.data(), false};
  n.grad = Tensor::uninitialized(n.value.shape());
  return {n.grad.data(), true};
}

bool adopt_grad(const Var& x, Tensor& gradient) {
  Node& n = x.gradient_node();
  if (!n.requires_grad || !n.grad.empty()) return false;
  if (gradient.shape() != n.value.shape())
    throw std::invalid_argument(fmt::format("adopt_grad: a gradient of shape {} for a value of shape {}",
                                            to_string(gradient.shape()), to_string(n.value.shape())));
  n.grad = std::move(gradient);
  gradient = Tensor();
  return true;
}

GradTarget grad_target(const Var& x, std::initializer_list<Var> others) {
  for (const Var& o : others)
    if (&o.node() == &x.node()) return {grad_ptr(x), false};
  return grad_target(x);
}

bool overwrite_all(std::initializer_list<GradTarget> targets, std::size_t size) {
  bool all_overwrite = true;
  for (const GradTarget& g : targets) all_overwrite = all_overwrite && (!g.data || g.overwrite);
  if (!all_overwrite)  // an overwrite target's buffer holds no values yet: zero it to add into
    for (const GradTarget& g : targets)
      if (g.overwrite) std::fill_n(g.data, size, 0.0f);
  return all_overwrite;
}

float* grad_ptr(const Var& x) {
  Tensor* g = grad_if_needed(x);
  return g ? g->data() : nullptr;
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    std::size_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    std::size_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      throw std::invalid_argument(fmt::format("{}: cannot broadcast a {} with b {} (axis {} has sizes {} and {})", op,
                                              to_string(a), to_string(b), i, da, db));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

bool broadcastable_to(const Shape& x, const Shape& shape) {
  if (x.size() > shape.size()) return false;
  for (std::size_t i = 0, lead = shape.size() - x.size(); i < x.size(); ++i)
    if (x[i] != 1 && x[i] != shape[lead + i]) return false;
  return true;
}

namespace {

// Strides of x read under the broadcast shape: 0 along axes x lacks or has size 1.
std::vector<std::size_t> broadcast_strides(const Shape& x, const Shape& shape) {
  std::size_t rank = shape.size(), lead = rank - x.size();
  std::vector<std::size_t> strides(rank, 0);
  std::size_t stride = 1;
  for (std::size_t i = x.size(); i-- > 0;) {
    strides[lead + i] = x[i] == 1 ? 0 : stride;
    stride *= x[i];
  }
  return strides;
}

// Calls f(i, j) for every element i of shape (row-major) with j its offset in x read under the
// broadcast: an odometer over the axes, no division per element.
template <class F>
void for_each_broadcast(const Shape& x, const Shape& shape, F f) {
  std::vector<std::size_t> strides = broadcast_strides(x, shape), index(shape.size(), 0);
  std::size_t total = numel(shape), offset = 0;
  for (std::size_t i = 0; i < total; ++i) {
    f(i, offset);
    for (std::size_t axis = shape.size(); axis-- > 0;) {
      offset += strides[axis];
      if (++index[axis] < shape[axis]) break;
      offset -= strides[axis] * shape[axis];
      index[axis] = 0;
    }
  }
}

void check_broadcastable(const char* what, const Shape& x, const Shape& shape) {
  if (!broadcastable_to(x, shape))
    throw std::invalid_argument(fmt::format("{}: {} does not broadcast to {}", what, to_string(x), to_string(shape)));
}

}  // namespace

Tensor expand_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  check_broadcastable("expand_to", x.shape(), shape);
  Tensor out = Tensor::uninitialized(shape);
  for_each_broadcast(x.shape(), shape, [&](std::size_t i, std::size_t j) { out[i] = x[j]; });
  return out;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  check_broadcastable("sum_to", shape, g.shape());
  Tensor out(shape);
  for_each_broadcast(shape, g.shape(), [&](std::size_t i, std::size_t j) { out[j] += g[i]; });
  return out;
}

void accumulate_grad(const Var& x, const Tensor& g) {
  Tensor* dx = grad_if_needed(x);
  if (!dx) return;
  if (g.shape() == dx->shape()) {
    for (std::size_t i = 0; i < g.size(); ++i) (*dx)[i] += g[i];
    return;
  }
  check_broadcastable("accumulate_grad", dx->shape(), g.shape());
  for_each_broadcast(dx->shape(), g.shape(), [&](std::size_t i, std::size_t j) { (*dx)[j] += g[i]; });
}

std::size_t axis_index(const char* op, int axis, const Shape& shape) {
  int rank = int(shape.size());
  if (axis < -rank || axis >= rank)
    throw std::invalid_argument(fmt::format("{}: axis {} is out of range for x {}", op, axis, to_string(shape)));
  return std::size_t(axis < 0 ? axis + rank : axis);
}

AxisSplit split_at_axis(const Shape& shape, std::size_t axis) {
  AxisSplit s{1, shape[axis], 1};
  for (std::size_t i = 0; i < axis; ++i) s.outer *= shape[i];
  for (std::size_t i = axis + 1; i < shape.size(); ++i) s.inner *= shape[i];
  return s;
}

Op::Op(const char* name, std::initializer_list<Var> inputs)
    : name_(name), tape_(tape_for(name, inputs, [](const Var& v) -> const Var& { return v; })) {
  record_versions(std::span(inputs.begin(), inputs.size()));
}

Op::Op(const char* name, const std::vector<Var>& inputs)
    : name_(name), tape_(tape_for(name, inputs, [](const Var& v) -> const Var& { return v; })) {
  record_versions(inputs);
}

void Op::record_versions(std::span<const Var> inputs) {
  if (!tape_) return;  // nothing will be recorded, nothing checked
  inputs_.reserve(inputs.size());
  for (const Var& v : inputs) inputs_.emplace_back(v);
}

Var Op::finish(Tensor value, Backward backward, std::size_t saved_bytes) {
  auto out = std::make_shared<Node>();
  out->value = std::move(value);
  if (tape_)
    tape_->record(
        name_, std::move(inputs_), out, [backward = std::move(backward)](Node& o) { backward(o.grad, o.value); },
        saved_bytes);
  return Var(out);
}

}  // namespace tapegrad
