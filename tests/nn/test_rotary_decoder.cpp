// The seed model (RotaryDecoder): its parameter count and names, initialisation and forward.
#include <doctest/doctest.h>

#include <cmath>

#include "core/ops.h"
#include "nn/models/rotary_decoder.h"
#include "support/checks.h"

using namespace tapegrad;
using namespace tapegrad::nn;
using test::random_ids;

TEST_CASE("rotary_decoder(65, 64, 4, 2, 256) has exactly 139,777 parameters with the checkpoint names") {
  RotaryDecoder model = rotary_decoder(65, 64, 4, 2, 256);
  CHECK(model.num_params() == 139777);
  ParameterList params = model.params();
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  std::vector<std::string> expected = {"embed.weight"};
  for (int i = 0; i < 2; ++i)
    for (const char* n : {"attn_norm.weight", "attn.wq.weight", "attn.wk.weight", "attn.wv.weight", "attn.wo.weight",
                          "ffn_norm.weight", "ffn.w1.weight", "ffn.w3.weight", "ffn.w2.weight"})
      expected.push_back(fmt::format("blocks.{}.{}", i, n));
  for (const char* n : {"norm.weight", "head.weight", "head.bias"}) expected.push_back(n);
  CHECK(names == expected);
  CHECK(params[1].var.shape() == Shape{64});            // attn_norm
  CHECK(params[7].var.shape() == Shape{64, 256});       // ffn.w1 (in, out)
  CHECK(params[9].var.shape() == Shape{256, 64});       // ffn.w2
  CHECK(fmt::format("{}", model.blocks[0]) == "RotaryDecoderBlock(64, 4, d_ff=256)");
  CHECK(fmt::format("{}", rotary_decoder(65, 64, 4, 2, 256, 96, true).blocks[1]) == "RotaryDecoderBlock(64, 4, d_ff=96)");
  CHECK(fmt::format("{}", model) ==
        "RotaryDecoder(vocab=65, d_model=64, n_heads=4, n_blocks=2, max_len=256, d_ff=256, remat=false)");
}

TEST_CASE("initialisation is seeded and follows the documented scheme") {
  RotaryDecoder a = rotary_decoder(65, 64, 4, 2, 32, std::nullopt, false, 7), b = rotary_decoder(65, 64, 4, 2, 32, std::nullopt, false, 7);
  RotaryDecoder c = rotary_decoder(65, 64, 4, 2, 32, std::nullopt, false, 8);
  CHECK(max_abs_diff(a.embed.weight.value(), b.embed.weight.value()) == 0.0f);
  CHECK(max_abs_diff(a.embed.weight.value(), c.embed.weight.value()) > 0.0f);
  auto stddev = [](const Tensor& t) {
    double s = 0;
    for (std::size_t i = 0; i < t.size(); ++i) s += double(t[i]) * t[i];
    return std::sqrt(s / double(t.size()));
  };
  CHECK(stddev(a.blocks[0].wq.weight.value()) == doctest::Approx(0.02).epsilon(0.05));
  CHECK(stddev(a.blocks[0].w2.weight.value()) == doctest::Approx(0.01).epsilon(0.05));  // 0.02 / sqrt(2 * 2)
  CHECK(a.norm.weight.value()[3] == 1.0f);
  CHECK(a.head.bias.value()[3] == 0.0f);
}

TEST_CASE("forward gives (B, T, vocab) logits and the initial loss is close to log(vocab)") {
  RotaryDecoder model = rotary_decoder(65, 32, 2, 2, 16);
  auto ids = random_ids(3 * 16, 65, 1), targets = random_ids(3 * 16, 65, 2);
  CHECK(model.forward(ids, 3, 16).shape() == Shape{3, 16, 65});
  float loss = model.loss(ids, targets, 3, 16).value().item();
  CHECK(std::fabs(loss - std::log(65.0f)) < 0.05f);
}

TEST_CASE("the whole decoder's gradient passes gradcheck") {
  // Larger init than the default so that every path carries signal above the float noise.
  RotaryDecoderConfig config{.vocab = 7, .d_model = 8, .n_heads = 2, .n_blocks = 2, .max_len = 5, .d_ff = 12};
  RotaryDecoder model(config);
  Rng rng(3);
  for (auto& p : model.params())
    if (p.var.shape().size() == 2) rng.fill_normal(p.var.mutable_value(), 0.5f);
  auto ids = random_ids(2 * 5, 7, 4), targets = random_ids(2 * 5, 7, 5);
  // Every parameter: analytic gradients against central differences of the loss itself.
  {
    Tape tape;
    tape.backward(model.loss(ids, targets, 2, 5));
  }
  for (NamedParameter& p : model.params()) {
    Var& var = p.var;  // shares its node with the model's parameter
    std::vector<float> x(var.value().data(), var.value().data() + var.value().size());
    std::vector<float> analytic(var.grad().data(), var.grad().data() + x.size());
    auto forward = [&] {
      std::copy(x.begin(), x.end(), var.node().value.data());
      NoGradScope no_grad;
      return std::vector<float>{model.loss(ids, targets, 2, 5).value().item()};
    };
    GradcheckReport r = check_kernel_gradient<float>(p.name, x, forward, {1.0f}, analytic, test::kFloatEps,
                                                     test::kFloatAtol, test::kFloatRtol);
    std::copy(x.begin(), x.end(), var.node().value.data());
    CHECK_MESSAGE(r.ok, r.message);
  }
}

TEST_CASE("impossible configurations are refused naming the values") {
  CHECK(test::contains(test::error_of([] { rotary_decoder(65, 30, 4, 2, 256); }), "d_model 30 is not divisible by n_heads 4"));
  CHECK(test::contains(test::error_of([] { rotary_decoder(65, 12, 4, 2, 256); }), "head size d_model / n_heads = 3 must be even"));
  CHECK(test::contains(test::error_of([] { rotary_decoder(0, 64, 4, 2, 256); }),
                       "rotary_decoder(vocab=0, d_model=64, n_heads=4, n_blocks=2, max_len=256, d_ff=256): every size must be positive"));
  CHECK(test::contains(test::error_of([] { rotary_decoder(65, 64, 0, 2, 256); }), "every size must be positive"));
  CHECK(test::contains(test::error_of([] { rotary_decoder(65, 64, 4, 2, 256, 0); }), "d_ff=0): every size must be positive"));
  CHECK(test::contains(test::error_of([] { rotary_decoder(65, 4, 1, 1, std::size_t(1) << 31); }),
                       "max_len 2147483648 exceeds the supported 1048576"));
  CHECK(test::contains(test::error_of([] { rotary_decoder(65, 1024, 1, 1, 1 << 20); }),
                       "max_len x d_model = 1073741824 exceeds the supported 268435456"));
}

TEST_CASE("forward refuses sequences longer than max_len and ids outside the vocabulary") {
  RotaryDecoder model = rotary_decoder(11, 16, 2, 1, 8);
  auto ids = random_ids(9, 11, 1);
  CHECK(test::error_of([&] { model.forward(ids, 1, 9); }) == "forward: seq_len 9 exceeds max_len 8");
  std::vector<std::int32_t> bad = {1, 2, 11};
  CHECK(test::error_of([&] { model.forward(bad, 1, 3); }) ==
        "embedding: id 11 at index 2 is outside the vocabulary of size 11");
}

TEST_CASE("gradients are identical across runs for a fixed thread count, with parallel kernels active") {
  // Large enough that attention, row kernels and matmuls all take their parallel paths.
  RotaryDecoder model = rotary_decoder(17, 64, 4, 2, 64, std::nullopt, false, 5);
  auto ids = random_ids(8 * 64, 17, 1), targets = random_ids(8 * 64, 17, 2);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<Tensor> first;
    for (int run = 0; run < 3; ++run) {
      {
        Tape tape;
        tape.backward(model.loss(ids, targets, 8, 64));
      }
      auto params = model.params();
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (run == 0) first.push_back(params[i].var.grad());
        else CHECK(max_abs_diff(first[i], params[i].var.grad()) == 0.0f);
        params[i].var.zero_grad();
      }
    }
  }
  set_num_threads(0);
}
