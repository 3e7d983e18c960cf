// Rematerialised blocks: loss, gradients, training and generation bit for bit as without remat.
#include <doctest/doctest.h>

#include "core/ops.h"
#include "nn/generate.h"
#include "nn/models/rotary_decoder.h"
#include "support/checks.h"

using namespace tapegrad;
using namespace tapegrad::nn;
using test::random_ids;

namespace {

struct Run {
  float loss;
  std::size_t tape_bytes;
  std::vector<Tensor> grads;
};

Run loss_and_grads(const RotaryDecoder& model, std::span<const std::int32_t> ids, std::span<const std::int32_t> targets,
                   std::size_t batch, std::size_t seq) {
  Tape tape;
  Var loss = model.loss(ids, targets, batch, seq);
  Run run{loss.value().item(), tape.bytes(), {}};
  tape.backward(loss);
  for (auto& p : model.params()) {
    run.grads.push_back(p.var.grad());
    p.var.zero_grad();
  }
  return run;
}
}  // namespace

// Tolerance: remat runs the same kernels in the same order on bit-identical inputs, so the loss
// and every gradient must be bit-identical (0 difference), stricter than the 1e-6 relative promised.
TEST_CASE("remat gives bit-identical loss and gradients for many shapes") {
  struct Case { std::size_t batch, heads, blocks, seq, max_len; };
  for (auto c : {Case{3, 1, 1, 1, 16}, Case{2, 4, 3, 16, 16}, Case{4, 4, 1, 70, 70}, Case{2, 1, 3, 9, 12}}) {
    CAPTURE(c.batch);
    CAPTURE(c.heads);
    CAPTURE(c.blocks);
    CAPTURE(c.seq);
    RotaryDecoder plain = rotary_decoder(17, 16, c.heads, c.blocks, c.max_len, 24, false, 5);
    RotaryDecoder remat = rotary_decoder(17, 16, c.heads, c.blocks, c.max_len, 24, true, 5);
    auto ids = random_ids(c.batch * c.seq, 17, 1), targets = random_ids(c.batch * c.seq, 17, 2);
    Run a = loss_and_grads(plain, ids, targets, c.batch, c.seq), b = loss_and_grads(remat, ids, targets, c.batch, c.seq);
    CHECK(a.loss == b.loss);
    auto names = plain.params();
    for (std::size_t i = 0; i < a.grads.size(); ++i) {
      CAPTURE(names[i].name);
      CHECK(max_abs_diff(a.grads[i], b.grads[i]) == 0.0f);
    }
    // Bytes on the tape. Plain, per block of B*T rows (D model, F ffn, H heads), in floats:
    // attn_norm out + rstd, q, rope q, k, rope k, v, attention out + its log-sum-exp per row and
    // head (flash attention keeps no probabilities), x + att Wo (8 BTD + BT + B H T) and ffn_norm
    // out + rstd, w1, w3, swiglu (3 BTF), h + swiglu W2 (2 BTD + BT): 10 BTD + 3 BTF + 2 BT + B H T.
    // Remat keeps one BTD (the block output) per block.
    std::size_t B = c.batch, T = c.seq, D = 16, F = 24, H = c.heads;
    std::size_t per_block = 10 * B * T * D + 3 * B * T * F + 2 * B * T + B * H * T;
    CHECK(a.tape_bytes - b.tape_bytes == c.blocks * (per_block - B * T * D) * sizeof(float));
  }
}

TEST_CASE("a remat model trained N steps ends with the same parameters as the plain one") {
  RotaryDecoder plain = rotary_decoder(17, 16, 2, 2, 12, std::nullopt, false, 3);
  RotaryDecoder remat = rotary_decoder(17, 16, 2, 2, 12, std::nullopt, true, 3);
  for (int step = 0; step < 5; ++step) {
    auto ids = random_ids(2 * 13, 17, 10 + step);
    std::vector<std::int32_t> inputs, targets;
    for (std::size_t b = 0; b < 2; ++b) {
      inputs.insert(inputs.end(), ids.begin() + b * 13, ids.begin() + b * 13 + 12);
      targets.insert(targets.end(), ids.begin() + b * 13 + 1, ids.begin() + b * 13 + 13);
    }
    for (RotaryDecoder* m : {&plain, &remat}) {
      Run r = loss_and_grads(*m, inputs, targets, 2, 12);
      auto params = m->params();
      for (std::size_t i = 0; i < params.size(); ++i) {
        Tensor& v = params[i].var.mutable_value();
        for (std::size_t j = 0; j < v.size(); ++j) v[j] -= 0.5f * r.grads[i][j];
      }
    }
  }
  auto a = plain.params(), b = remat.params();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(max_abs_diff(a[i].var.value(), b[i].var.value()) == 0.0f);
}

TEST_CASE("generation is unaffected by the remat flag") {
  RotaryDecoder plain = rotary_decoder(17, 16, 2, 2, 30, std::nullopt, false, 4);
  RotaryDecoder remat = rotary_decoder(17, 16, 2, 2, 30, std::nullopt, true, 4);
  std::vector<std::int32_t> prompt = {1, 2};
  GenerateOptions options{.max_new = 20, .sampling = {.temperature = 1.0f}, .seed = 9};
  CHECK(generate(plain, prompt, options).tokens == generate(remat, prompt, options).tokens);
  options.use_cache = false;
  CHECK(generate(plain, prompt, options).tokens == generate(remat, prompt, options).tokens);
}
