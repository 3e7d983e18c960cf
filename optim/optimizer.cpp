// The optimizer base: parameters, slot tensors, step count, and their export and checked restore.
#include "optim/optimizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <map>
#include <stdexcept>
#include <utility>

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
    auto [it, inserted] = seen.emplace(p.name, i);
    if (!inserted)
      throw std::invalid_argument(fmt::format("{}: parameters {} and {} are both named '{}'; names must be distinct "
                                              "(they key the optimizer state)",
                                              name_, it->second, i, p.name));
  }
  slots_.resize(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i)
    for (std::size_t s = 0; s < slot_names_.size(); ++s) slots_[i].emplace_back(params_[i].var.shape());
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
  OptimizerState out;
  out.step = step_;
  out.tensors.reserve(params_.size() * slot_names_.size());
  for (std::size_t i = 0; i < params_.size(); ++i)
    for (std::size_t s = 0; s < slot_names_.size(); ++s)
      out.tensors.push_back({state_name(params_[i].name, slot_names_[s]), slots_[i][s]});
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
  for (const auto& [name, where] : expected) slots_[where.first][where.second] = *given.at(name);
  step_ = state.step;
}

}  // namespace tapegrad::optim
