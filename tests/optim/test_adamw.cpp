// AdamW against a hand-computed double recurrence, decay only on matrices, version bumps, state
// export and restore (directly and through a safetensors file), and overfitting one batch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "io/safetensors.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/schedule.h"
#include "optim/tiny_model.h"

using namespace tapegrad;
using test::contains;
using test::error_of;

namespace {

// The gradient of element i at step t (1-based): fixed values of either sign and varying size.
double grad_at(std::size_t i, int t) { return 0.8 * std::sin(1.3 * double(i) + 0.7 * t) + 0.05 * t; }

// One AdamW step of one scalar in double, written from the paper's Algorithm 2 with PyTorch's
// order (decay first, then the moments, then the bias-corrected step).
void reference_step(double& p, double& m, double& v, double g, int t, double lr, double wd,
                    const optim::AdamWOptions& o) {
  const double b1 = o.beta1, b2 = o.beta2, eps = o.eps;
  p *= 1.0 - lr * wd;
  m = b1 * m + (1.0 - b1) * g;
  v = b2 * v + (1.0 - b2) * g * g;
  const double m_hat = m / (1.0 - std::pow(b1, t)), v_hat = v / (1.0 - std::pow(b2, t));
  p -= lr * m_hat / (std::sqrt(v_hat) + eps);
}

}  // namespace

TEST_CASE("AdamW follows the hand-computed recurrence for four steps, decaying the matrix but not the vector") {
  // 36 and 19 elements: both the SIMD blocks (8 or 16 lanes) and the scalar tail are exercised.
  const std::size_t nw = 36, nb = 19, n = nw + nb;
  Var w(test::random_tensor({4, 9}, 11, 0.5f), true), b(test::random_tensor({nb}, 12, 0.5f), true);
  optim::AdamWOptions options{.lr = 1e-2f, .weight_decay = 0.1f};
  optim::AdamW opt({{"w", w}, {"b", b}}, options);
  const std::vector<float> lrs = {1e-2f, 3e-2f, 5e-3f, 2e-2f};  // the lr changes every step, as a schedule does

  // Reference state per element, in double: w's elements then b's.
  std::vector<double> p, m(n, 0.0), v(n, 0.0);
  for (std::size_t i = 0; i < nw; ++i) p.push_back(w.value()[i]);
  for (std::size_t i = 0; i < nb; ++i) p.push_back(b.value()[i]);
  auto value_of = [&](std::size_t i) { return i < nw ? w.value()[i] : b.value()[i - nw]; };

  for (int t = 1; t <= 4; ++t) {
    for (std::size_t i = 0; i < nw; ++i) w.grad_buffer()[i] = float(grad_at(i, t));
    for (std::size_t i = 0; i < nb; ++i) b.grad_buffer()[i] = float(grad_at(nw + i, t));
    opt.set_lr(lrs[t - 1]);
    opt.step();
    for (std::size_t i = 0; i < n; ++i) {
      const double wd = i < nw ? double(options.weight_decay) : 0.0;  // b is 1-D: never decayed
      reference_step(p[i], m[i], v[i], double(float(grad_at(i, t))), t, double(lrs[t - 1]), wd, options);
    }
  }
  // Tolerance: each float step rounds p, m and v a few times at relative 6e-8 (|p| < 2, so
  // 2.4e-7 absolute at most per step); four steps stay below 1e-6. A wrong order, bias
  // correction or decay target moves p by lr * wd * |p| ~ 1e-4 or more.
  const double tolerance = 1e-6;
  for (std::size_t i = 0; i < n; ++i)
    CHECK_MESSAGE(std::abs(value_of(i) - p[i]) <= tolerance, "element ", i, ": ", value_of(i), " vs reference ", p[i]);
  optim::OptimizerState state = opt.state();
  CHECK(state.step == 4);
  REQUIRE(state.tensors.size() == 4);
  CHECK(state.tensors[0].name == "optim.w.m");
  CHECK(state.tensors[1].name == "optim.w.v");
  CHECK(state.tensors[2].name == "optim.b.m");
  CHECK(state.tensors[3].name == "optim.b.v");
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t slot = i < nw ? 0 : 2, j = i < nw ? i : i - nw;
    CHECK(std::abs(state.tensors[slot].value[j] - m[i]) <= 1e-6);      // |m| < 1
    CHECK(std::abs(state.tensors[slot + 1].value[j] - v[i]) <= 1e-7);  // |v| < 1e-2
  }
}

TEST_CASE("with zero gradients AdamW only shrinks the matrices, and decay_all_params shrinks every parameter") {
  for (bool decay_all : {false, true}) {
    Var w(Tensor({2, 2}, 2.0f), true), norm(Tensor({2}, 1.0f), true);
    optim::AdamW opt({{"w", w}, {"norm.weight", norm}},
                     {.lr = 0.1f, .weight_decay = 0.5f, .decay_all_params = decay_all});
    w.grad_buffer();
    norm.grad_buffer();  // zeros: m = v = 0, so the Adam term is 0 / (0 + eps) = 0
    opt.step();
    CHECK(w.value()[3] == 2.0f * float(1.0 - 0.1 * 0.5));
    CHECK(norm.value()[1] == (decay_all ? float(1.0 - 0.1 * 0.5) : 1.0f));
  }
}

TEST_CASE("an AdamW step bumps the version of every parameter it updates and of no other") {
  test::TinyModel model(1);
  Var unused(Tensor({3}), true);
  ParameterList params = model.params;
  params.push_back({"unused", unused});
  optim::AdamW opt(params);
  std::vector<std::uint64_t> before;
  for (const auto& p : params) before.push_back(p.var.version());
  test::train_step(model, test::TinyBatch(), opt, 1e-3f);
  for (std::size_t i = 0; i < model.params.size(); ++i)
    CHECK_MESSAGE(params[i].var.version() > before[i], params[i].name);
  CHECK(unused.version() == before.back());  // no gradient reached it: untouched
}

TEST_CASE("AdamW state exported after N steps and loaded into a new optimizer continues bit-identically") {
  const int n = 6;
  const test::TinyBatch batch;
  const auto lr_at = [](int step) { return optim::LrSchedule::warmup_cosine(1e-2f, 3, 12, 1e-3f).at(step); };

  test::TinyModel straight(5);
  optim::AdamW straight_opt(straight.params, {.weight_decay = 0.1f});
  for (int s = 0; s < 2 * n; ++s) test::train_step(straight, batch, straight_opt, lr_at(s));

  test::TinyModel first(5);
  optim::AdamW first_opt(first.params, {.weight_decay = 0.1f});
  for (int s = 0; s < n; ++s) test::train_step(first, batch, first_opt, lr_at(s));
  optim::OptimizerState saved = first_opt.state();

  test::TinyModel resumed(99);  // different initial values, overwritten by the saved ones
  for (std::size_t i = 0; i < resumed.params.size(); ++i)
    resumed.params[i].var.mutable_value() = first.params[i].var.value();
  optim::AdamW resumed_opt(resumed.params, {.weight_decay = 0.1f});
  resumed_opt.load_state(saved);
  CHECK(resumed_opt.steps() == n);
  for (int s = n; s < 2 * n; ++s) test::train_step(resumed, batch, resumed_opt, lr_at(s));

  for (std::size_t i = 0; i < straight.params.size(); ++i)
    CHECK_MESSAGE(test::bitwise_equal(resumed.params[i].var.value(), straight.params[i].var.value()),
                  straight.params[i].name);
  optim::OptimizerState a = straight_opt.state(), b = resumed_opt.state();
  for (std::size_t i = 0; i < a.tensors.size(); ++i)
    CHECK_MESSAGE(test::bitwise_equal(a.tensors[i].value, b.tensors[i].value), a.tensors[i].name);
}

TEST_CASE("AdamW state written to a safetensors file and read back continues bit-identically") {
  const test::TinyBatch batch;
  test::TinyModel model(3), copy(3);
  optim::AdamW opt(model.params), copy_opt(copy.params);
  for (int s = 0; s < 4; ++s) {
    test::train_step(model, batch, opt, 1e-2f);
    test::train_step(copy, batch, copy_opt, 1e-2f);
  }
  const std::string path =
      (std::filesystem::temp_directory_path() / ("tapegrad_adamw_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  optim::OptimizerState state = opt.state();
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const auto& t : state.tensors) tensors.emplace_back(t.name, &t.value);
  write_safetensors(path, tensors, {{"step", std::to_string(state.step)}});

  SafetensorsFile file = read_safetensors(path);
  std::filesystem::remove(path);
  optim::OptimizerState loaded;
  loaded.step = std::stoll(file.metadata.at("step"));
  for (auto& [name, value] : file.tensors) loaded.tensors.push_back({name, value});  // any order is accepted
  optim::AdamW resumed_opt(model.params);
  resumed_opt.load_state(loaded);
  for (int s = 0; s < 3; ++s) {
    test::train_step(model, batch, resumed_opt, 1e-2f);
    test::train_step(copy, batch, copy_opt, 1e-2f);
  }
  for (std::size_t i = 0; i < model.params.size(); ++i)
    CHECK(test::bitwise_equal(model.params[i].var.value(), copy.params[i].var.value()));
}

TEST_CASE("AdamW overfits one batch of a tiny embedding-matmul model to near-zero loss") {
  const test::TinyBatch batch;
  test::TinyModel model(2);
  optim::AdamW opt(model.params, {.weight_decay = 0.01f});
  const auto schedule = optim::LrSchedule::warmup_cosine(5e-2f, 10, 300, 5e-3f);
  float first = 0.0f, last = 0.0f;
  for (int s = 0; s < 300; ++s) {
    opt.zero_grad();
    Tape tape;
    Var loss = model.loss(batch.ids, batch.targets);
    tape.backward(loss);
    optim::clip_grad_norm(model.params, 1.0f);
    opt.set_lr(schedule.at(s));
    opt.step();
    (s == 0 ? first : last) = loss.value().item();
  }
  // ln(16) = 2.77 at the start; a model that memorises its 16 rows reaches well below 0.01 nats.
  CHECK(first > 2.0f);
  CHECK_MESSAGE(last < 0.01f, "loss after 300 steps: ", last);
}

TEST_CASE("AdamW refuses invalid hyperparameters, naming them and their values") {
  Var w(Tensor({2, 2}), true);
  CHECK(error_of([&] { optim::AdamW({{"w", w}}, {.beta1 = 1.0f}); }) == "AdamW: beta1 must be in [0, 1), got 1");
  CHECK(error_of([&] { optim::AdamW({{"w", w}}, {.beta2 = -0.5f}); }) ==
        "AdamW: beta2 must be in [0, 1), got -0.5");
  CHECK(contains(error_of([&] { optim::AdamW({{"w", w}}, {.lr = -1.0f}); }), "AdamW: lr must be finite and >= 0"));
  CHECK(contains(error_of([&] { optim::AdamW({{"w", w}}, {.eps = NAN}); }), "AdamW: eps must be finite"));
  CHECK(contains(error_of([&] { optim::AdamW({{"w", w}}, {.weight_decay = -0.1f}); }), "weight_decay"));
  optim::AdamW opt({{"w", w}});
  CHECK(contains(error_of([&] { opt.set_lr(INFINITY); }), "AdamW: lr must be finite and >= 0, got inf"));
}

TEST_CASE("AdamW kept to ranges of the flat order (ZeRO-1 shards) updates every element as the whole optimizer does") {
  const test::TinyBatch batch;
  test::TinyModel whole_model(21);
  optim::AdamW whole(whole_model.params, {.lr = 1e-2f, .weight_decay = 0.1f});
  const std::size_t total = optim::flat_size(whole_model.params);
  REQUIRE(total == 272);
  // Three "ranks", cut inside parameters and off any SIMD width.
  const std::vector<optim::FlatRange> ranges = {{0, 37}, {37, 150}, {150, total}};
  std::vector<test::TinyModel> models;
  std::vector<std::unique_ptr<optim::AdamW>> shards;
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    models.emplace_back(21);
    shards.push_back(std::make_unique<optim::AdamW>(models[r].params, whole.options()));
    shards[r]->keep_only(ranges[r]);
    CHECK(shards[r]->state_bytes() == 2 * ranges[r].size() * sizeof(float));
  }
  CHECK(whole.state_bytes() == 2 * total * sizeof(float));
  for (int step = 1; step <= 3; ++step) {
    test::train_step(whole_model, batch, whole, 1e-2f);
    for (std::size_t r = 0; r < ranges.size(); ++r) test::train_step(models[r], batch, *shards[r], 1e-2f);
    for (std::size_t r = 0; r < ranges.size(); ++r)  // every rank's updated range to every replica
      for (const optim::ParameterPiece& piece : optim::pieces_in(models[r].params, ranges[r]))
        for (test::TinyModel& other : models)
          std::copy_n(models[r].params[piece.parameter].var.value().data() + piece.begin, piece.count,
                      other.params[piece.parameter].var.mutable_value().data() + piece.begin);
  }
  for (const test::TinyModel& m : models)
    for (std::size_t i = 0; i < m.params.size(); ++i)
      CHECK(test::bitwise_equal(m.params[i].var.value(), whole_model.params[i].var.value()));

  // The state put together from the pieces is the whole optimizer's.
  CHECK_THROWS_WITH_AS(shards[0]->state(), doctest::Contains("keeps the state of elements [0, 37) of 272 only"),
                       std::logic_error);
  std::vector<std::vector<std::vector<float>>> held(ranges.size());  // [rank][slot]
  for (std::size_t r = 0; r < ranges.size(); ++r)
    shards[r]->state([&](std::span<const float> mine) {
      held[r].emplace_back(mine.begin(), mine.end());
      return std::vector<float>(total);
    });
  std::size_t slot = 0;
  const optim::OptimizerState gathered = shards[1]->state([&](std::span<const float>) {
    std::vector<float> all;
    for (const auto& rank : held) all.insert(all.end(), rank[slot].begin(), rank[slot].end());
    ++slot;
    return all;
  });
  const optim::OptimizerState expected = whole.state();
  REQUIRE(gathered.tensors.size() == expected.tensors.size());
  CHECK(gathered.step == expected.step);
  for (std::size_t t = 0; t < expected.tensors.size(); ++t) {
    CHECK(gathered.tensors[t].name == expected.tensors[t].name);
    CHECK(test::bitwise_equal(gathered.tensors[t].value, expected.tensors[t].value));
  }
  // A whole state loads into a shard (it keeps its range), and a range outside the held one is refused.
  shards[2]->load_state(expected);
  CHECK_THROWS_WITH_AS(shards[2]->keep_only({0, 200}), doctest::Contains("is not within the held elements [150, 272)"),
                       std::invalid_argument);
}
