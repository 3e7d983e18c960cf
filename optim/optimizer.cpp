// The optimizer base: parameters, slot tensors, step count, and their export and checked restore.
#include "optim/optimizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <utility>

#include "core/kernels.h"

namespace tapegrad::optim {

namespace detail {
void check_hyperparameter(const char* optimizer, const char* what, double value, bool ok, const char* rule) {
  if (!ok) throw std::invalid_argument(fmt::format("{}: {} must be {}, got {}", optimizer, what, rule, value));
}
}  // namespace detail

Optimizer::Optimizer(const char* name, ParameterList params, std::vector<std::string> slot_names, float lr)
    : name_(name), params_(std::move(params)), slot_names_(std::move(slot_names)), lr_(0.0f) {
  set_lr(lr);
  std::map<std::string, std::size_t> seen;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const NamedParameter& p = params_[i];
    if (!p.var.defined())
      throw std::invalid_argument(fmt::format("{}: parameter '{}' (index {}) is an undefined Var", name_, p.name, i));
    if (!p.var.requires_grad())
      throw std::invalid_argument(fmt::format("{}: parameter '{}' (index {}) is frozen (requires_grad false) and would "
                                              "hold state it never uses; pass trainable(params)",
                                              name_, p.name, i));
    auto [it, inserted] = seen.emplace(p.name, i);
    if (!inserted)
      throw std::invalid_argument(fmt::format("{}: parameters {} and {} are both named '{}'; names must be distinct "
                                              "(they key the optimizer state)",
                                              name_, it->second, i, p.name));
  }
  hold({0, flat_size(params_)});
  slots_.assign(slot_names_.size(), std::vector<float>(held_.size(), 0.0f));
}

std::size_t flat_size(const ParameterList& params) {
  std::size_t n = 0;
  for (const NamedParameter& p : params) n += p.var.value().size();
  return n;
}

std::vector<ParameterPiece> pieces_in(const ParameterList& params, FlatRange range) {
  std::vector<ParameterPiece> pieces;
  std::size_t flat = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::size_t n = params[i].var.value().size();
    const std::size_t begin = std::max(flat, range.begin), end = std::min(flat + n, range.end);
    if (begin < end) pieces.push_back({i, begin - flat, end - begin, begin});
    flat += n;
  }
  return pieces;
}

void Optimizer::hold(FlatRange range) {
  held_ = range;
  held_parts_.assign(params_.size(), {});
  slot_offsets_.assign(params_.size(), 0);
  for (const ParameterPiece& piece : pieces_in(params_, range)) {
    held_parts_[piece.parameter] = {piece.begin, piece.count};
    slot_offsets_[piece.parameter] = piece.flat - range.begin;
  }
}

void Optimizer::keep_only(FlatRange range) {
  if (range.begin > range.end || range.begin < held_.begin || range.end > held_.end)
    throw std::invalid_argument(fmt::format("{}::keep_only: the range [{}, {}) is not within the held elements "
                                            "[{}, {})",
                                            name_, range.begin, range.end, held_.begin, held_.end));
  for (std::vector<float>& values : slots_)
    values = std::vector<float>(values.begin() + std::ptrdiff_t(range.begin - held_.begin),
                                values.begin() + std::ptrdiff_t(range.end - held_.begin));
  hold(range);
}

void Optimizer::step_scaled(float grad_scale) {
  if (grad_scale != 1.0f)
    for (const NamedParameter& p : params_) {
      if (!p.var.has_grad()) continue;
      Tensor& grad = Var(p.var).grad_buffer();
      kernels::scale_forward(grad.data(), grad.data(), grad_scale, grad.size());
    }
  step();
}

void Optimizer::zero_grad() {
  for (NamedParameter& p : params_) p.var.zero_grad();
}

void Optimizer::set_lr(float lr) {
  detail::check_hyperparameter(name_, "lr", lr, std::isfinite(lr) && lr >= 0.0f, "finite and >= 0");
  lr_ = lr;
}

std::string Optimizer::state_name(const std::string& parameter, const std::string& slot) {
  return fmt::format("optim.{}.{}", parameter, slot);
}

OptimizerState Optimizer::state() const {
  const std::size_t all = flat_size(params_);
  if (held_.begin != 0 || held_.end != all)
    throw std::logic_error(fmt::format("{}::state: this optimizer keeps the state of elements [{}, {}) of {} only; "
                                       "gather the other ranks' pieces (state with a GatherSlot)",
                                       name_, held_.begin, held_.end, all));
  return state_of_slots([this](std::size_t s) { return std::span<const float>(slots_[s]); });
}

OptimizerState Optimizer::state(const GatherSlot& gather) const {
  std::vector<float> gathered;
  return state_of_slots([&](std::size_t s) {
    gathered = {};  // one gathered slot at a time: a slot of AdamW at SmolLM2's size is 538 MB
    gathered = gather(slots_[s]);
    return std::span<const float>(gathered);
  });
}

// The copies go straight from each slot into the tensors (a training checkpoint is written while
// they exist beside the weights, gradients and slots: every extra copy raised the save's peak).
OptimizerState Optimizer::state_of_slots(const std::function<std::span<const float>(std::size_t)>& slot_values) const {
  const std::size_t all = flat_size(params_), slots = slot_names_.size();
  const std::vector<ParameterPiece> pieces = pieces_in(params_, {0, all});
  OptimizerState out;
  out.step = step_;
  out.tensors.resize(pieces.size() * slots);  // parameter by parameter, slot by slot
  for (std::size_t s = 0; s < slots; ++s) {
    const std::span<const float> values = slot_values(s);
    if (values.size() != all)
      throw std::logic_error(fmt::format("{}::state: the gathered slot '{}' has {} elements, the parameters {}",
                                         name_, slot_names_[s], values.size(), all));
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const NamedParameter& p = params_[pieces[i].parameter];
      Tensor value = Tensor::uninitialized(p.var.shape());
      std::copy_n(values.data() + pieces[i].flat, pieces[i].count, value.data());
      out.tensors[i * slots + s] = {state_name(p.name, slot_names_[s]), std::move(value)};
    }
  }
  return out;
}

const char* Optimizer::invalid_slot_value(std::size_t, float value) const {
  return std::isfinite(value) ? nullptr : "optimizer state must be finite";
}

void Optimizer::load_state(const OptimizerState& state) {
  if (state.step < 0)
    throw std::invalid_argument(fmt::format("{}::load_state: the step count must be >= 0, got {}", name_, state.step));
  // Validate everything before copying anything, so a bad state leaves the optimizer as it was.
  std::map<std::string, std::pair<std::size_t, std::size_t>> expected;  // name -> (parameter, slot)
  for (std::size_t i = 0; i < params_.size(); ++i)
    for (std::size_t s = 0; s < slot_names_.size(); ++s) expected[state_name(params_[i].name, slot_names_[s])] = {i, s};
  std::map<std::string, const Tensor*> given;
  for (const NamedTensor& t : state.tensors) {
    auto it = expected.find(t.name);
    if (it == expected.end())
      throw std::invalid_argument(fmt::format("{}::load_state: unexpected tensor '{}': it is not the state of any of "
                                              "the {} parameters (slots: {})",
                                              name_, t.name, params_.size(), fmt::join(slot_names_, ", ")));
    if (!given.emplace(t.name, &t.value).second)
      throw std::invalid_argument(fmt::format("{}::load_state: tensor '{}' appears twice", name_, t.name));
    const NamedParameter& p = params_[it->second.first];
    if (t.value.shape() != p.var.shape())
      throw std::invalid_argument(fmt::format("{}::load_state: tensor '{}' has shape {}, expected {} (the shape of "
                                              "parameter '{}')",
                                              name_, t.name, to_string(t.value.shape()), to_string(p.var.shape()),
                                              p.name));
    const std::size_t slot_index = it->second.second;
    for (std::size_t e = 0; e < t.value.size(); ++e)
      if (const char* why = invalid_slot_value(slot_index, t.value[e]))
        throw std::invalid_argument(fmt::format("{}::load_state: tensor '{}' holds {} at element {}: {}", name_, t.name,
                                                t.value[e], e, why));
  }
  for (const auto& [name, where] : expected)
    if (!given.count(name))
      throw std::invalid_argument(fmt::format("{}::load_state: missing tensor '{}' (the '{}' state of parameter '{}' "
                                              "of shape {})",
                                              name_, name, slot_names_[where.second], params_[where.first].name,
                                              to_string(params_[where.first].var.shape())));
  for (const auto& [name, where] : expected) {
    const Tensor& value = *given.at(name);
    const Held part = held_parts_[where.first];
    std::copy_n(value.data() + part.begin, part.count, slot(where.first, where.second));
  }
  step_ = state.step;
}

}  // namespace tapegrad::optim
