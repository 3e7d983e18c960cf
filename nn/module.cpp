// Module's walks over members(): the named parameters, and the mode passed down to every child.
#include "nn/module.h"

#include <stdexcept>
#include <string>
#include <typeinfo>

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

// The module whose default members() is asking its collect_params, on this thread: a module
// that overrides neither would otherwise go round between the two defaults.
thread_local const Module* listing_from_collect_params = nullptr;

}  // namespace

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void Module::members(Members& m) {
  if (listing_from_collect_params == this)
    throw std::logic_error(std::string("Module: ") + typeid(*this).name() +
                           " overrides neither members() nor collect_params(): name its parameters in members()");
  const Module* outer = listing_from_collect_params;
  listing_from_collect_params = this;
  ParameterList listed;
  try {
    collect_params("", listed);
  } catch (...) {
    listing_from_collect_params = outer;
    throw;
  }
  listing_from_collect_params = outer;
  for (NamedParameter& p : listed) m(p.name, p.var);
}
#pragma GCC diagnostic pop

void Module::collect_params(const std::string& prefix, ParameterList& out) const {
  for (NamedParameter& p : params()) out.push_back({prefix + p.name, p.var});
}

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
