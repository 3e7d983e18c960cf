// Module: a module names its parameters and children once, in members(), and params(), the
// train/eval mode and save/load all follow from that one list.
#include <doctest/doctest.h>

#include <string>
#include <type_traits>
#include <vector>

#include "core/ops.h"
#include "core/random.h"
#include "nn/dropout.h"
#include "nn/linear.h"

using namespace tapegrad;

namespace {

// A user's module that overrides nothing but members(): a dropout child, a child without a
// bias, a vector of children, and a parameter of its own.
struct Tower : nn::Module {
  nn::Linear in;
  nn::Dropout drop{0.5f};
  std::vector<nn::Linear> layers;
  Var scale = nn::parameter({4});
  explicit Tower(Rng& rng) : in(3, 4, false, 0.5f, rng) {
    for (int i = 0; i < 2; ++i) layers.emplace_back(4, 4, true, 0.5f, rng);
  }
  Var forward(const Var& x, Rng& rng) const { return drop.forward(in.forward(x), rng); }
  void members(nn::Members& m) override {
    m("in", in);
    m("drop", drop);
    m("layers", layers);
    m("scale", scale);
  }
};

std::vector<std::string> names_of(const nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& p : module.params()) names.push_back(p.name);
  return names;
}

}  // namespace

TEST_CASE("a module that names its children once has their parameters under dotted names, in order") {
  Rng rng(3);
  Tower tower(rng);
  CHECK(names_of(tower) == std::vector<std::string>{"in.weight", "layers.0.weight", "layers.0.bias",
                                                    "layers.1.weight", "layers.1.bias", "scale"});
  CHECK(tower.num_params() == 3 * 4 + 2 * (4 * 4 + 4) + 4);
  CHECK(tower.params()[0].var.value().data() == tower.in.weight.value().data());  // shared, not copied
}

TEST_CASE("train and eval reach a dropout child that only members() names") {
  Rng rng(4);
  Tower tower(rng);
  NoGradScope no_grad;
  Var x(Tensor({64, 3}, 1.0f));
  Tensor plain = tower.in.forward(x).value();
  auto zeros_of = [&] {
    Rng masks(5);
    Tensor y = tower.forward(x, masks).value();
    std::size_t zeros = 0;
    for (std::size_t i = 0; i < y.size(); ++i) zeros += y[i] == 0.0f && plain[i] != 0.0f;
    return zeros;
  };
  CHECK(tower.drop.training());
  CHECK(zeros_of() > 0);  // training: a mask zeroes about half

  tower.eval();
  CHECK_FALSE(tower.training());
  CHECK_FALSE(tower.drop.training());
  CHECK_FALSE(tower.layers[1].training());
  CHECK(zeros_of() == 0);
  Rng masks(5);
  CHECK(max_abs_diff(tower.forward(x, masks).value(), plain) == 0.0f);  // evaluation: the identity

  tower.train();
  CHECK(tower.drop.training());
  CHECK(tower.layers[1].training());
  CHECK(zeros_of() > 0);
}

namespace {

// A module that names its parameters nowhere.
struct Unnamed : nn::Module {};

}  // namespace

TEST_CASE("a module that does not name its members is abstract: members() has no default to fall back on") {
  CHECK(std::is_abstract_v<nn::Module>);
  CHECK(std::is_abstract_v<Unnamed>);
  CHECK_FALSE(std::is_abstract_v<nn::Linear>);
}
