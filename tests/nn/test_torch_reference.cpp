// PyTorch's values inside the suite: outputs and gradients of a handful of ops and of both
// architectures at a tiny size, computed by PyTorch in float64 from float32 inputs and weights
// stored in tests/data/torch_reference.json. No PyTorch is needed to run this; to regenerate
// the file: bench/.venv/bin/python bench/write_reference_values.py
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/ops.h"
#include "nn/models/gpt2.h"
#include "nn/models/rotary_decoder.h"

using namespace tapegrad;
using nlohmann::json;

namespace {

// tapegrad computes in float32 against PyTorch's float64: its error is the rounding of a few
// float32 sums and products of O(1) values. The worst seen at every SIMD level is under 1e-6
// absolute (gelu_tanh's dx); the tolerance leaves 20x room for other BLAS and compilers while
// still failing any real error (a wrong term is O(1e-3) or more).
constexpr double kAtol = 2e-5, kRtol = 1e-4;

const json& reference() {
  static const json data = [] {
    const std::string path = TAPEGRAD_SOURCE_DIR "/tests/data/torch_reference.json";
    std::ifstream in(path);
    REQUIRE_MESSAGE(in, "cannot open " << path);
    return json::parse(in);
  }();
  return data;
}

Tensor tensor_of(const json& t) {
  return Tensor(t.at("shape").get<Shape>(), t.at("values").get<std::vector<float>>());
}

std::vector<std::int32_t> ids_of(const json& ids) { return ids.get<std::vector<std::int32_t>>(); }

/// Every element of actual within kAtol + kRtol |expected| of PyTorch's; names the worst.
void check_close(const std::string& what, const Tensor& actual, const json& expected) {
  const Shape shape = expected.at("shape").get<Shape>();
  REQUIRE_MESSAGE(actual.shape() == shape, what << ": tapegrad's shape is " << to_string(actual.shape())
                                                 << ", PyTorch's " << to_string(shape));
  const std::vector<double> values = expected.at("values").get<std::vector<double>>();
  double worst_excess = 0;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    double excess = std::fabs(double(actual[i]) - values[i]) - (kAtol + kRtol * std::fabs(values[i]));
    if (!(excess <= worst_excess)) {  // NaN counts as the worst
      worst_excess = excess;
      worst = i;
    }
  }
  CHECK_MESSAGE(worst_excess <= 0, fmt::format("{} {}: element {} is {} in tapegrad, {} in PyTorch (tolerance {} + {} "
                                               "|torch|)",
                                               what, to_string(shape), worst, actual[worst], values[worst], kAtol,
                                               kRtol));
}

using OpUnderTest = std::function<Var(const std::map<std::string, Var>& inputs, const json& args)>;

// The ops the file holds, by its names; a case on one side only fails the test below.
const std::map<std::string, OpUnderTest>& ops_under_test() {
  static const std::map<std::string, OpUnderTest> ops = {
      {"softmax", [](auto& in, auto&) { return softmax(in.at("x"), -1); }},
      {"cross_entropy",
       [](auto& in, auto& args) { return cross_entropy(in.at("logits"), ids_of(args.at("targets"))); }},
      {"rms_norm", [](auto& in, auto&) { return rms_norm(in.at("x"), in.at("weight")); }},
      {"layer_norm", [](auto& in, auto&) { return layer_norm(in.at("x"), in.at("weight"), in.at("bias")); }},
      {"rope",
       [](auto& in, auto& args) {
         const Var& x = in.at("x");
         const std::size_t n_heads = args.at("n_heads");
         auto table = std::make_shared<const kernels::RopeTable<float>>(
             kernels::make_rope_table<float>(args.at("max_len"), x.shape().back() / n_heads));
         return rope(x, table, n_heads, args.at("offset"));
       }},
      {"attention",
       [](auto& in, auto& args) {
         return attention(in.at("q"), in.at("k"), in.at("v"), args.at("n_heads").template get<std::size_t>());
       }},
      {"swiglu", [](auto& in, auto&) { return swiglu(in.at("a"), in.at("b")); }},
      {"gelu_tanh", [](auto& in, auto&) { return gelu(in.at("x"), /*approximate_tanh=*/true); }},
  };
  return ops;
}

/// The model's parameters set to the file's weights; every name and shape must match.
template <class Model>
void load_weights(Model& model, const json& weights) {
  std::set<std::string> names;
  for (NamedParameter& p : model.params()) {
    REQUIRE_MESSAGE(weights.contains(p.name), "no weights for " << p.name << " in the file");
    Tensor w = tensor_of(weights.at(p.name));
    REQUIRE_MESSAGE(w.shape() == p.var.shape(),
                    p.name << ": the file's shape is " << to_string(w.shape()) << ", the model's "
                           << to_string(p.var.shape()));
    p.var.mutable_value() = std::move(w);
    names.insert(p.name);
  }
  CHECK(names.size() == weights.size());
}

/// The logits, the loss and every parameter's gradient of the file's model case.
template <class Model>
void check_model(const std::string& arch, Model& model, const json& ref) {
  load_weights(model, ref.at("weights"));
  const std::size_t batch = ref.at("batch"), seq_len = ref.at("seq_len");
  const std::vector<std::int32_t> inputs = ids_of(ref.at("inputs")), targets = ids_of(ref.at("targets"));
  {
    NoGradScope no_grad;
    check_close(arch + " logits", model.forward(inputs, batch, seq_len).value(), ref.at("logits"));
  }
  Tape tape;
  Var loss = model.loss(inputs, targets, batch, seq_len);
  CHECK(loss.value().item() == doctest::Approx(ref.at("loss").get<double>()).epsilon(kRtol));
  tape.backward(loss);
  for (const NamedParameter& p : model.params()) check_close(arch + " d" + p.name, p.var.grad(), ref.at("grads").at(p.name));
}

}  // namespace

TEST_CASE("ops give PyTorch's outputs and gradients within float32 rounding") {
  const json& cases = reference().at("ops");
  std::set<std::string> in_file;
  for (const auto& [name, c] : cases.items()) {
    in_file.insert(name);
    CAPTURE(name);
    REQUIRE_MESSAGE(ops_under_test().contains(name), "the file has op " << name << ", which this test does not run");
    std::map<std::string, Var> inputs;
    for (const auto& [input, value] : c.at("inputs").items()) inputs.emplace(input, Var(tensor_of(value), true));
    Tape tape;
    Var y = ops_under_test().at(name)(inputs, c.at("args"));
    check_close(name + " output", y.value(), c.at("output"));
    tape.backward(sum(mul(y, Var(tensor_of(c.at("R"))))));
    for (const auto& [input, x] : inputs) check_close(name + " d" + input, x.grad(), c.at("grads").at(input));
  }
  for (const auto& [name, op] : ops_under_test())
    CHECK_MESSAGE(in_file.contains(name), "op " << name << " has no case in the file: regenerate it");
}

TEST_CASE("the rotary decoder gives PyTorch's logits, loss and gradients") {
  const json& ref = reference().at("models").at("rotary");
  const json& c = ref.at("config");
  nn::RotaryDecoder model(nn::RotaryDecoderConfig{.vocab = c.at("vocab"), .d_model = c.at("d_model"),
                                            .n_heads = c.at("n_heads"), .n_blocks = c.at("n_blocks"),
                                            .max_len = c.at("max_len"), .d_ff = c.at("d_ff").get<std::size_t>()});
  check_model("rotary", model, ref);
}

TEST_CASE("gpt2 gives PyTorch's logits, loss and gradients") {
  const json& ref = reference().at("models").at("gpt2");
  const json& c = ref.at("config");
  nn::Gpt2 model(nn::Gpt2Config{.vocab = c.at("vocab"), .d_model = c.at("d_model"), .n_heads = c.at("n_heads"),
                                .n_blocks = c.at("n_blocks"), .max_len = c.at("max_len"),
                                .d_ff = c.at("d_ff").get<std::size_t>()});
  check_model("gpt2", model, ref);
}
