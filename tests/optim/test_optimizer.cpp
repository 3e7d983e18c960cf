// The optimizer base: parameter checks, zero_grad, and load_state's validation and atomicity.
#include <doctest/doctest.h>

#include <cmath>

#include "optim/adamw.h"
#include "optim/sgd.h"
#include "support/helpers.h"

using namespace tapegrad;
using test::contains;
using test::error_of;

namespace {
ParameterList two_params() {
  return {{"blocks.0.attn.wq.weight", Var(Tensor({2, 3}), true)}, {"norm.weight", Var(Tensor({3}), true)}};
}
}  // namespace

TEST_CASE("optimizer state names are optim.<parameter>.<slot> in parameter then slot order") {
  optim::AdamW opt(two_params());
  optim::OptimizerState state = opt.state();
  REQUIRE(state.tensors.size() == 4);
  CHECK(state.tensors[0].name == "optim.blocks.0.attn.wq.weight.m");
  CHECK(state.tensors[1].name == "optim.blocks.0.attn.wq.weight.v");
  CHECK(state.tensors[3].name == "optim.norm.weight.v");
  CHECK(state.tensors[3].value.shape() == Shape{3});
  CHECK(state.step == 0);
}

TEST_CASE("zero_grad drops every gradient and a parameter without one is skipped by step") {
  ParameterList params = two_params();
  optim::AdamW opt(params);
  params[0].var.grad_buffer().fill(1.0f);
  const std::uint64_t version = params[1].var.version();
  opt.step();
  CHECK(params[1].var.version() == version);
  CHECK(params[1].var.value()[0] == 0.0f);
  opt.zero_grad();
  CHECK_FALSE(params[0].var.has_grad());
}

TEST_CASE("an optimizer refuses two parameters with the same name and undefined parameters") {
  ParameterList params = two_params();
  params.push_back({"norm.weight", Var(Tensor({3}), true)});
  CHECK(error_of([&] { optim::SGD opt(params); }) ==
        "SGD: parameters 1 and 2 are both named 'norm.weight'; names must be distinct (they key the optimizer state)");
  CHECK(contains(error_of([&] { optim::AdamW opt({{"x", Var()}}); }), "AdamW: parameter 'x' (index 0) is an undefined Var"));
}

TEST_CASE("load_state names a missing tensor, a wrong shape, an unexpected or repeated name, and changes nothing") {
  ParameterList params = two_params();
  optim::AdamW source(params);
  params[0].var.grad_buffer().fill(1.0f);
  params[1].var.grad_buffer().fill(1.0f);
  source.step();
  const optim::OptimizerState good = source.state();
  optim::AdamW target(params);

  optim::OptimizerState missing = good;
  missing.tensors.erase(missing.tensors.begin() + 1);
  CHECK(error_of([&] { target.load_state(missing); }) ==
        "AdamW::load_state: missing tensor 'optim.blocks.0.attn.wq.weight.v' (the 'v' state of parameter "
        "'blocks.0.attn.wq.weight' of shape [2, 3])");

  optim::OptimizerState misshapen = good;
  misshapen.tensors[2].value = Tensor({3, 1});
  CHECK(error_of([&] { target.load_state(misshapen); }) ==
        "AdamW::load_state: tensor 'optim.norm.weight.m' has shape [3, 1], expected [3] (the shape of parameter "
        "'norm.weight')");

  optim::OptimizerState unexpected = good;
  unexpected.tensors.push_back({"optim.head.bias.m", Tensor({3})});
  CHECK(contains(error_of([&] { target.load_state(unexpected); }),
                 "AdamW::load_state: unexpected tensor 'optim.head.bias.m'"));

  optim::OptimizerState repeated = good;
  repeated.tensors.push_back(good.tensors[0]);
  CHECK(contains(error_of([&] { target.load_state(repeated); }), "'optim.blocks.0.attn.wq.weight.m' appears twice"));

  optim::OptimizerState negative = good;
  negative.step = -3;
  CHECK(contains(error_of([&] { target.load_state(negative); }), "step count must be >= 0, got -3"));

  optim::OptimizerState negative_v = good;
  negative_v.tensors[1].value[2] = -0.5f;  // forged: v is a mean of squares
  CHECK(error_of([&] { target.load_state(negative_v); }) ==
        "AdamW::load_state: tensor 'optim.blocks.0.attn.wq.weight.v' holds -0.5 at element 2: the second moment v "
        "must be >= 0");
  optim::OptimizerState nan_m = good;
  nan_m.tensors[0].value[1] = std::nanf("");
  CHECK(error_of([&] { target.load_state(nan_m); }) ==
        "AdamW::load_state: tensor 'optim.blocks.0.attn.wq.weight.m' holds nan at element 1: optimizer state must be "
        "finite");

  // Every failure above left the target at its initial state.
  CHECK(target.steps() == 0);
  for (const auto& t : target.state().tensors) CHECK(t.value[0] == 0.0f);
  target.load_state(good);
  CHECK(target.steps() == 1);
  CHECK(target.state().tensors[0].value[0] != 0.0f);
}
