// DecoderModel::loss runs the description with the head and its cross-entropy fused
// (linear_cross_entropy): it must be cross_entropy of forward's logits, value and gradients, for
// every kind of head.
#include <doctest/doctest.h>

#include <cmath>

#include "core/ops.h"
#include "nn/models/gpt2.h"
#include "nn/models/llama.h"
#include "nn/models/rotary_decoder.h"
#include "support/checks.h"

using namespace tapegrad;
using namespace tapegrad::nn;

namespace {

// The loss and every parameter's gradient, by loss() or by cross_entropy(forward()).
template <class Model>
std::vector<Tensor> loss_and_gradients(const Model& model, bool fused) {
  const std::size_t batch = 2, seq = 7, vocab = model.config().vocab;
  const std::vector<std::int32_t> ids = test::random_ids(batch * seq, vocab, 4), targets = test::random_ids(batch * seq, vocab, 5);
  std::vector<Tensor> out;
  {
    Tape tape;
    Var loss = fused ? model.loss(ids, targets, batch, seq) : cross_entropy(model.forward(ids, batch, seq), targets);
    out.push_back(loss.value());
    tape.backward(loss);
  }
  for (auto& p : model.params()) {
    out.push_back(p.var.grad());
    p.var.zero_grad();
  }
  return out;
}

template <class Model>
void check_loss_is_cross_entropy_of_forward(const Model& model) {
  const std::vector<Tensor> fused = loss_and_gradients(model, true), composed = loss_and_gradients(model, false);
  REQUIRE(fused.size() == composed.size());
  for (std::size_t k = 0; k < fused.size(); ++k) {
    CAPTURE(k);  // 0: the loss, then the parameters' gradients in order
    for (std::size_t i = 0; i < fused[k].size(); ++i)
      CHECK(std::fabs(fused[k][i] - composed[k][i]) <= 2e-6 + 1e-4 * std::fabs(composed[k][i]));
  }
}

}  // namespace

TEST_CASE("a model's loss is the cross-entropy of its logits, gradients too, whatever its head") {
  SUBCASE("llama, a head of its own") {
    LlamaConfig c{.vocab = 23, .d_model = 16, .n_heads = 4, .n_blocks = 2, .max_len = 16};
    c.n_kv_heads = 2, c.seed = 1;
    check_loss_is_cross_entropy_of_forward(Llama(c));
  }
  SUBCASE("llama, the head tied to the embedding") {
    LlamaConfig c{.vocab = 23, .d_model = 16, .n_heads = 4, .n_blocks = 2, .max_len = 16};
    c.n_kv_heads = 1, c.tied_head = true, c.seed = 2;
    check_loss_is_cross_entropy_of_forward(Llama(c));
  }
  SUBCASE("the rotary decoder, a head with a bias") {
    check_loss_is_cross_entropy_of_forward(rotary_decoder(23, 16, 4, 2, 16));
  }
  SUBCASE("gpt2, the tied head") {
    check_loss_is_cross_entropy_of_forward(gpt2(23, 16, 4, 2, 16));
  }
}
