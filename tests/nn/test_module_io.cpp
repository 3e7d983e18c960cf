// Any Module saves and loads its named parameters as safetensors with the user's metadata.
#include <doctest/doctest.h>

#include <filesystem>

#include "io/safetensors.h"
#include "nn/models/gpt2.h"
#include "nn/module_io.h"
#include "support/checks.h"

using namespace tapegrad;

namespace {

// A user's module: two linear layers, composed from the public API.
struct Mlp : nn::Module {
  nn::Linear l1, l2;
  Mlp(Rng& rng) : l1(3, 5, true, 0.5f, rng), l2(5, 2, true, 0.5f, rng) {}
  void members(nn::Members& m) override {
    m("l1", l1);
    m("l2", l2);
  }
};

std::string temp_path(const char* name) { return test::process_path(name); }

}  // namespace

TEST_CASE("a user's module round-trips its parameters and metadata through safetensors") {
  Rng rng(1), other(2);
  Mlp a(rng), b(other);
  std::string path = temp_path("tapegrad_module_io.safetensors");
  nn::save_module(path, a, {{"note", "two spirals"}, {"epochs", "30"}});
  std::map<std::string, std::string> meta = nn::load_module(path, b);
  CHECK(meta.at("note") == "two spirals");
  CHECK(meta.at("epochs") == "30");
  auto pa = a.params(), pb = b.params();
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(max_abs_diff(pa[i].var.value(), pb[i].var.value()) == 0.0f);
  CHECK(read_safetensors(path).tensors.count("l2.bias") == 1);

  // A module of another shape is refused, naming the file and the tensor, and left unchanged.
  nn::Gpt2 model = nn::gpt2(5, 4, 2, 1, 4);
  Tensor before = model.embed.weight.value();
  std::string message = test::error_of([&] { nn::load_module(path, model); });
  CHECK(test::contains(message, path));
  CHECK(test::contains(message, "tensor 'embed.weight' is missing"));
  CHECK(max_abs_diff(model.embed.weight.value(), before) == 0.0f);
  Mlp wider_rng(rng);
  nn::Linear& l1 = wider_rng.l1;
  l1.weight = nn::parameter({4, 5});
  CHECK(test::contains(test::error_of([&] { nn::load_module(path, wider_rng); }),
                       "tensor 'l1.weight' has shape [3, 5] but the module's parameter is [4, 5]"));
  std::filesystem::remove(path);
}

TEST_CASE("a gpt2 round-trips through save_module and load_module") {
  nn::Gpt2 a = nn::gpt2(7, 8, 2, 1, 6, std::nullopt, 0, false, 1), b = nn::gpt2(7, 8, 2, 1, 6, std::nullopt, 0, false, 2);
  std::string path = temp_path("tapegrad_gpt2_io.safetensors");
  nn::save_module(path, a, {{"arch", "gpt2"}});
  CHECK(nn::load_module(path, b).at("arch") == "gpt2");
  std::vector<std::int32_t> ids = {1, 2, 3, 4};
  NoGradScope no_grad;
  CHECK(max_abs_diff(a.forward(ids, 1, 4).value(), b.forward(ids, 1, 4).value()) == 0.0f);
  std::filesystem::remove(path);
}
