// Module's walks over members(): the named parameters, and the mode passed down to every child.
#include "nn/module.h"

#include <string>

namespace tapegrad::nn {

namespace {

// Appends every defined parameter under its dotted path from the root module.
class ParameterCollector final : public Members {
 public:
  explicit ParameterCollector(ParameterList& out) : out_(out) {}
  using Members::operator();
  void operator()(std::string_view name, Var& parameter) override {
    if (parameter.defined()) out_.push_back({prefix_ + std::string(name), parameter});
  }
  void operator()(std::string_view name, Module& child) override {
    const std::size_t length = prefix_.size();
    prefix_.append(name).append(".");
    child.members(*this);
    prefix_.resize(length);
  }

 private:
  ParameterList& out_;
  std::string prefix_;
};

// Sets the mode of every child (each passes it on to its own).
class ModeSetter final : public Members {
 public:
  explicit ModeSetter(bool on) : on_(on) {}
  using Members::operator();
  void operator()(std::string_view, Var&) override {}
  void operator()(std::string_view, Module& child) override { child.train(on_); }

 private:
  bool on_;
};

}  // namespace

ParameterList Module::params() const {
  ParameterList out;
  ParameterCollector collector(out);
  // members() is one function for every walk; this one only copies the parameters' handles.
  const_cast<Module&>(*this).members(collector);
  return out;
}

std::size_t Module::num_params() const {
  std::size_t n = 0;
  for (const auto& p : params()) n += p.var.value().size();
  return n;
}

void Module::freeze() {
  for (NamedParameter& p : params()) p.var.node().requires_grad = false;
}

void Module::train(bool on) {
  training_ = on;
  ModeSetter setter(on);
  members(setter);
}

}  // namespace tapegrad::nn
